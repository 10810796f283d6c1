#!/bin/bash
# TODO: flags
exec python3 -m app "$@"
