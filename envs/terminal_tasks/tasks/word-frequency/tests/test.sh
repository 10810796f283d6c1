#!/bin/bash
# Harbor's entry point: the task's check (check.sh) run in /workspace; its exit status is the reward.
# No Python user site or bytecode, and HOME in /tmp: nothing the agent planted in /workspace runs.
export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
unset PYTHONPATH PYTHONSTARTUP BASH_ENV ENV
if cd /workspace && bash /tests/check.sh; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
