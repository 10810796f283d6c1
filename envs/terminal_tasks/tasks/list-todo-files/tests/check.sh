python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


EXPECTED = ["src/app.py", "src/cli.sh", "src/db/models.py"]
try:
    got = Path("todo_files.txt").read_text().split()
except OSError as err:
    fail(f"cannot read todo_files.txt: {err}")
if got != EXPECTED:
    fail(f"todo_files.txt lists {got}")
print("OK")
PY
