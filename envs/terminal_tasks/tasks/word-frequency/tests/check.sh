python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)



EXPECTED = {
    "counts.txt": "6 the\n4 fox\n4 quick\n3 lazy\n2 and\n2 dog\n2 is\n2 jumps\n1 a\n1 afternoons\n1 again\n1 being\n1 brown\n1 does\n1 dogs\n1 feet\n1 foxes\n1 jump\n1 not\n1 of\n1 over\n1 story\n"
}

for path, want in EXPECTED.items():
    if not Path(path).is_file():
        fail(f"{path} is missing")
    if Path(path).read_text() != want:
        fail(f"{path} does not have the expected content")

print("OK")
PY
