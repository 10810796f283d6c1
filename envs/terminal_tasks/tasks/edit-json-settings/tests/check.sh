python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


import json

try:
    got = json.loads(Path("settings.json").read_text())
except (OSError, ValueError) as err:
    fail(f"cannot read settings.json: {err}")
want = {"name": "demo", "debug": False, "features": ["search", "export"], "retries": 3, "port": 8080}
if got != want or got.get("debug") is not False or type(got.get("port")) is not int:
    fail(f"settings.json holds {got!r}")
print("OK")
PY
