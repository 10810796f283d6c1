#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
grep -rnP TODO src || true
cat > todo_files.txt <<'__SOLUTION__'
src/app.py
src/cli.sh
src/db/models.py
__SOLUTION__
