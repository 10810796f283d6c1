#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cat data/people.csv
cat > convert.py <<'__SOLUTION__'
import csv
import json

with open("data/people.csv", newline="") as f:
    rows = [{"name": r["name"], "age": int(r["age"]), "city": r["city"]} for r in csv.DictReader(f)]
with open("data/people.json", "w") as f:
    json.dump(rows, f, indent=2)
__SOLUTION__
(
cd /workspace
python3 convert.py && cat data/people.json
)
