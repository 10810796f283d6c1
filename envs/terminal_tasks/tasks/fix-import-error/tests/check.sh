fail() { echo "FAIL: $*"; exit 1; }
out=$(python3 -s main.py 6 7 2>&1) || fail "main.py failed: $out"
[ "$out" = "42" ] || fail "python3 main.py 6 7 printed '$out'"
out=$(python3 -s main.py -3 5 2>&1)
[ "$out" = "-15" ] || fail "python3 main.py -3 5 printed '$out'"
a=$((RANDOM % 900 + 100)) b=$((RANDOM % 900 + 100))
out=$(python3 -s main.py $a $b 2>&1)
[ "$out" = "$((a * b))" ] || fail "python3 main.py $a $b printed '$out'"
out=$(python3 -s -c 'from calc.ops import add; print(add(2, 3))' 2>&1)
[ "$out" = "5" ] || fail "calc.ops.add no longer works: $out"
python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


if Path("main.py").read_text() != '"""Multiply two integers given on the command line."""\nimport sys\n\nfrom calc.ops import multiply\n\nif __name__ == "__main__":\n    a, b = (int(arg) for arg in sys.argv[1:3])\n    print(multiply(a, b))\n':
    fail("main.py was edited")
print("OK")
PY
