#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cat logs/app.log
(
cd /workspace
awk '$2 == "ERROR" {n[$3]++} END {for (s in n) print s, n[s]}' logs/app.log | LC_ALL=C sort > error_counts.txt && cat error_counts.txt
)
