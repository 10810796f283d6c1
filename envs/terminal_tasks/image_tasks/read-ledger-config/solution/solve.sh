#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
(
cd /workspace
ls /etc/ledger && cat /etc/ledger/ledger.conf && id ledger
)
(
cd /workspace
echo "$(sed -n 's/^port = //p' /etc/ledger/ledger.conf) $(id -u ledger)" > answer.txt && cat answer.txt
)
