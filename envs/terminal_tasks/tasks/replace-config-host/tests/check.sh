python3 -I - <<'PY'
import sys
from pathlib import Path


def fail(message):
    print("FAIL: " + message)
    sys.exit(1)



EXPECTED = {
    "config/app.conf": "# application\ndb_host=db.internal\ndb_port=5432\nlog_level=info\n",
    "config/services/worker.conf": "queue_url=amqp://db.internal:5672\ndb_host=db.internal\nthreads=4\n",
    "config/cache.conf": "size_mb=256\nttl_s=60\n",
    "config/README.txt": "Every default points at localhost.\n",
    "config/app.conf.bak": "db_host=localhost\n"
}

for path, want in EXPECTED.items():
    if not Path(path).is_file():
        fail(f"{path} is missing")
    if Path(path).read_text() != want:
        fail(f"{path} does not have the expected content")

print("OK")
PY
