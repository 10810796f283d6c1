#!/bin/bash
cat > /app/stats.py <<'PY'
"""Small statistics helpers."""


def median(values):
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2
PY
cd /app && python3 -m pytest -q -p no:cacheprovider
