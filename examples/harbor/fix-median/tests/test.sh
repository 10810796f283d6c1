#!/bin/bash
# Hidden tests: more cases than the agent saw. The reward is 1 only when every one passes.
cd /app || { echo 0 > /logs/verifier/reward.txt; exit 0; }
if python3 -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
