#!/bin/bash
# The expected line is written here, not read from the machine the agent changed.
if [ "$(cat /root/answer.txt 2>/dev/null)" = "7421 421" ]; then
    echo 1 > /logs/verifier/reward.txt
else
    echo "answer.txt says: $(head -c 200 /root/answer.txt 2>&1)"
    echo 0 > /logs/verifier/reward.txt
fi
