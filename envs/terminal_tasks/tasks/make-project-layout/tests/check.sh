fail() { echo "FAIL: $*"; exit 1; }
for d in src tests docs; do
  [ -d "project/$d" ] || fail "project/$d is not a directory"
  [ -f "project/$d/.gitkeep" ] || fail "project/$d/.gitkeep is missing"
  [ -s "project/$d/.gitkeep" ] && fail "project/$d/.gitkeep is not empty"
done
[ -f project/README.md ] || fail "project/README.md is missing"
[ "$(head -n 1 project/README.md)" = "# Project" ] || fail "the first line of project/README.md is not '# Project'"
echo OK
