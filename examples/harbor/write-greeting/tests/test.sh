#!/bin/bash
# Two parts, each worth half; reward.json carries both and the total.
cd /workspace || exit 1
file=0; script=0
[ "$(cat greeting.txt 2>/dev/null)" = "hello, harbor" ] && file=1
[ -x greeting.sh ] && [ "$(./greeting.sh 2>/dev/null)" = "hello, harbor" ] && script=1
python3 - "$file" "$script" <<'PY'
import json, sys
file, script = int(sys.argv[1]), int(sys.argv[2])
json.dump({"reward": (file + script) / 2, "file": file, "script": script}, open("/logs/verifier/reward.json", "w"))
PY
