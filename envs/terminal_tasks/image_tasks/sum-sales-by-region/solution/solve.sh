#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
head -3 sales.tsv; command -v datamash
)
(
cd /workspace
datamash --sort --header-in groupby 1 sum 2 < sales.tsv > totals.tsv && cat totals.tsv
)
