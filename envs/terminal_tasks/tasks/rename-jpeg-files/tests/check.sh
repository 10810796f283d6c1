python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)



EXPECTED = {
    "images/cat.jpg": "meow\n",
    "images/dog.jpg": "woof\n",
    "images/bird.jpg": "tweet\n",
    "images/notes.txt": "photos from the trip\n"
}

for path, want in EXPECTED.items():
    if not Path(path).is_file():
        fail(f"{path} is missing")
    if Path(path).read_text() != want:
        fail(f"{path} does not have the expected content")

left = sorted(str(p) for p in Path("images").rglob("*.jpeg"))
if left:
    fail(f"still named .jpeg: {left}")

print("OK")
PY
