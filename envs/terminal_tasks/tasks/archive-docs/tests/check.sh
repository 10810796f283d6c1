python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


import tarfile

EXPECTED = {
    "docs/guide.md": "# Guide\n\nStart here.\n",
    "docs/faq.md": "# FAQ\n\nNone yet.\n",
    "docs/img/logo.txt": "[logo]\n"
}

try:
    with tarfile.open("backup.tar.gz", "r:gz") as archive:
        members = archive.getmembers()
        files = {m.name.removeprefix("./"): archive.extractfile(m).read().decode() for m in members if m.isfile()}
        names = [m.name.removeprefix("./") for m in members]
except (OSError, tarfile.TarError) as err:
    fail(f"cannot read backup.tar.gz as a gzip tar archive: {err}")
outside = [n for n in names if n != "docs" and not n.startswith("docs/")]
if outside:
    fail(f"the archive holds paths outside docs/: {outside}")
if files != EXPECTED:
    fail(f"the archive holds {sorted(files)} with unexpected content")
print("OK")
PY
