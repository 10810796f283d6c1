#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
wc -w text/article.txt && head -n 3 text/article.txt
)
(
cd /workspace
LC_ALL=C tr -cs 'A-Za-z' '\n' < text/article.txt | tr 'A-Z' 'a-z' | grep -v '^$' | LC_ALL=C sort | uniq -c | LC_ALL=C sort -k1,1nr -k2,2 | awk '{print $1, $2}' > counts.txt && head -n 5 counts.txt
)
