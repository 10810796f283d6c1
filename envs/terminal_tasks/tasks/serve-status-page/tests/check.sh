python3 -I - <<'PY'
import sys
import urllib.error
import urllib.request


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)


def fetch(path):
    try:
        with urllib.request.urlopen("http://127.0.0.1:8080" + path, timeout=5) as reply:
            return reply.read().decode()
    except (OSError, urllib.error.URLError) as err:
        fail(f"nothing answers on port 8080 for {path}: {err}")


if fetch("/status.txt") != "ok: all systems go\n":
    fail("/status.txt is not site/status.txt")
if "<title>Status</title>" not in fetch("/index.html"):
    fail("/index.html is not site/index.html")
print("OK")
PY
