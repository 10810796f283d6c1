fail() { echo "FAIL: $*"; exit 1; }
command -v datamash >/dev/null || fail "datamash is not installed: this task runs in its own image"
[ -f totals.tsv ] || fail "totals.tsv is missing"
expected=$(printf 'east\t100\nnorth\t100\nsouth\t5\nwest\t150')
[ "$(cat totals.tsv)" = "$expected" ] || fail "totals.tsv holds: $(head -c 300 totals.tsv)"
echo OK
