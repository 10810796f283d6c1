fail() { echo "FAIL: $*"; exit 1; }
T=$(mktemp -d) && trap 'rm -rf "$T"' EXIT
printf 'alpha\n\nbeta\ngamma\n\n' > "$T/in.txt"
out=$(bash scripts/count_lines.sh "$T/in.txt" 2>/dev/null) || fail "the script failed on a valid file"
[ "$out" = "3" ] || fail "expected 3 non-empty lines, got '$out'"
out=$(bash scripts/count_lines.sh data/sample.txt 2>/dev/null)
[ "$out" = "4" ] || fail "expected 4 for data/sample.txt, got '$out'"
bash scripts/count_lines.sh >/dev/null 2>&1
rc=$?
[ "$rc" = 2 ] || fail "expected exit status 2 without arguments, got $rc"
bash scripts/count_lines.sh "$T/in.txt" extra >/dev/null 2>&1
rc=$?
[ "$rc" = 2 ] || fail "expected exit status 2 with two arguments, got $rc"
echo OK
