#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
tar -czf backup.tar.gz docs && tar -tzf backup.tar.gz
)
