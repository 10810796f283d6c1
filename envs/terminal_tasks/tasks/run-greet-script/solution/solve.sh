#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
chmod +x tools/greet.sh && ./tools/greet.sh world > greeting.txt && cat greeting.txt
)
