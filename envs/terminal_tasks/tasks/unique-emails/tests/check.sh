python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)



EXPECTED = {
    "unique_emails.txt": "alice@example.com\nbob@example.com\ncarol@example.org\ndave_smith@example.net\nerin.b@example.com\n"
}

for path, want in EXPECTED.items():
    if not Path(path).is_file():
        fail(f"{path} is missing")
    if Path(path).read_text() != want:
        fail(f"{path} does not have the expected content")

print("OK")
PY
