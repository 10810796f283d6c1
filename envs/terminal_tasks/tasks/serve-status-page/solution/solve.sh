#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
cd site && ls
python3 -m http.server 8080 > /tmp/server.log 2>&1 &
sleep 1; python3 -c "import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:8080/status.txt').read().decode())"
