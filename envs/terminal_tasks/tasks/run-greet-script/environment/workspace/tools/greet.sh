#!/bin/bash
echo "Hello, ${1:-nobody}!"
