#!/bin/bash
echo "$(sed -n 's/^port = //p' /etc/ledger/ledger.conf) $(id -u ledger)" > /root/answer.txt
cat /root/answer.txt
