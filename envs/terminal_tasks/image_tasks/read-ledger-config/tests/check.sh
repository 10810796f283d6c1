fail() { echo "FAIL: $*"; exit 1; }
uid=$(id -u ledger 2>/dev/null) || fail "there is no ledger account: this task runs in its own image"
port=$(sed -n 's/^port = //p' /etc/ledger/ledger.conf)
[ -n "$port" ] || fail "no port in /etc/ledger/ledger.conf"
[ -f answer.txt ] || fail "answer.txt is missing"
[ "$(cat answer.txt)" = "$port $uid" ] || fail "answer.txt says '$(head -c 200 answer.txt)'"
echo OK
