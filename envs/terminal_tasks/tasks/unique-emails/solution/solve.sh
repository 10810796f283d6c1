#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
cat -A emails.txt
)
(
cd /workspace
sed 's/^[[:space:]]*//; s/[[:space:]]*$//' emails.txt | tr 'A-Z' 'a-z' | grep -v '^$' | LC_ALL=C sort -u > unique_emails.txt && cat unique_emails.txt
)
