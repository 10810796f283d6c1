fail() { echo "FAIL: $*"; exit 1; }
[ -x tools/greet.sh ] || fail "tools/greet.sh is not executable"
[ -f greeting.txt ] || fail "greeting.txt is missing"
[ "$(cat greeting.txt)" = "Hello, world!" ] || fail "greeting.txt holds '$(head -c 200 greeting.txt)'"
python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)



EXPECTED = {
    "tools/greet.sh": "#!/bin/bash\necho \"Hello, ${1:-nobody}!\"\n"
}

for path, want in EXPECTED.items():
    if not Path(path).is_file():
        fail(f"{path} is missing")
    if Path(path).read_text() != want:
        fail(f"{path} does not have the expected content")

print("OK")
PY
