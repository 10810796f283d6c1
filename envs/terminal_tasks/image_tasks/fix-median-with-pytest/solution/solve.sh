#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
python3 -m pytest -q -p no:cacheprovider test_stats.py
)
cat > stats.py <<'__SOLUTION__'
"""Small statistics helpers."""


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
__SOLUTION__
(
cd /workspace
python3 -m pytest -q -p no:cacheprovider test_stats.py
)
