python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


import json

EXPECTED = [{"name": "Ada Lovelace", "age": 36, "city": "London"}, {"name": "Alan Turing", "age": 41, "city": "Wilmslow"}, {"name": "Hopper, Grace", "age": 85, "city": "Arlington"}, {"name": "Linus", "age": 54, "city": "Portland"}]

try:
    got = json.loads(Path("data/people.json").read_text())
except (OSError, ValueError) as err:
    fail(f"cannot read data/people.json: {err}")
if got != EXPECTED:
    fail(f"data/people.json holds {got!r}")
if not all(type(row["age"]) is int for row in got):
    fail("every age must be an integer")
print("OK")
PY
