#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
mkdir -p project/src project/tests project/docs && touch project/src/.gitkeep project/tests/.gitkeep project/docs/.gitkeep
)
mkdir -p project
cat > project/README.md <<'__SOLUTION__'
# Project

Source in src/, tests in tests/, documentation in docs/.
__SOLUTION__
(
cd /workspace
find project | sort && head -n 1 project/README.md
)
