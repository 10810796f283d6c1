#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cat settings.json
cat > settings.json <<'__SOLUTION__'
{
  "name": "demo",
  "debug": false,
  "features": [
    "search",
    "export"
  ],
  "retries": 3,
  "port": 8080
}
__SOLUTION__
