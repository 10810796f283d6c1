fail() { echo "FAIL: $*"; exit 1; }
T=$(mktemp -d) && trap 'rm -rf "$T"' EXIT
printf '10\n2\n7\n1\n' > "$T/even.txt"
printf '3\n9\n4\n' > "$T/odd.txt"
out=$(python3 -s stats.py "$T/even.txt" 2>&1) || fail "stats.py failed: $out"
[ "$out" = "$(printf 'mean=5.00\nmedian=4.50')" ] || fail "wrong output for 10 2 7 1: $out"
out=$(python3 -s stats.py "$T/odd.txt" 2>&1) || fail "stats.py failed: $out"
[ "$out" = "$(printf 'mean=5.33\nmedian=4.00')" ] || fail "wrong output for 3 9 4: $out"
echo OK
