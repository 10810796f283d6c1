#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cat scripts/count_lines.sh
mkdir -p scripts
cat > scripts/count_lines.sh <<'__SOLUTION__'
#!/bin/bash
# Print the number of non-empty lines in the file given as the only argument.
if [ $# -ne 1 ]; then
    echo "usage: count_lines.sh FILE" >&2
    exit 2
fi
grep -c . "$1"
__SOLUTION__
(
cd /workspace
bash scripts/count_lines.sh data/sample.txt; bash scripts/count_lines.sh; echo "exit=$?"
)
