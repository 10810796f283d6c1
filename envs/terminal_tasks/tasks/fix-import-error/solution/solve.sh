#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
python3 main.py 6 7
)
grep -rnP '^def ' calc || true
(
cd /workspace
printf '\n\nmultiply = mul\n' >> calc/ops.py && python3 main.py 6 7
)
