#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
ls -la images
)
(
cd /workspace
for f in images/*.jpeg; do mv -- "$f" "${f%.jpeg}.jpg"; done && ls images
)
