#!/bin/bash
# Hidden tests: more cases than the agent saw; the reward is 1 only when every one passes.
# pytest runs isolated (-I: no working folder or user site on its path, so a pytest.py or a .pth the agent
# left in /app is never imported), and the agent's code runs only in child processes the tests start
# (test_outputs.py), so nothing it does can reach the process that decides.
cd /tests || exit 1
if python3 -I -m pytest -q -p no:cacheprovider /tests/test_outputs.py; then
    echo 1 > /logs/verifier/reward.txt
else
    echo 0 > /logs/verifier/reward.txt
fi
