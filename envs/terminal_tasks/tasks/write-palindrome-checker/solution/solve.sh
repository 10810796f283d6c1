#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cat > palindrome.py <<'__SOLUTION__'
"""Print yes or no for each line of stdin: is it a palindrome, ignoring case and non-alphanumerics?"""
import sys

for line in sys.stdin:
    cleaned = [c.lower() for c in line if c.isalnum()]
    print("yes" if cleaned == cleaned[::-1] else "no")
__SOLUTION__
(
cd /workspace
printf 'Racecar!\nnope\n' | python3 palindrome.py
)
