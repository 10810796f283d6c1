#!/bin/bash
# The reference solution (solution/turns.json, the tool calls the demo policy plays) as one script.
cd /workspace || exit 1
grep -rnP localhost config || true
(
cd /workspace
find config -name '*.conf' -exec sed -i 's/localhost/db.internal/g' {} + && grep -rn db.internal config
)
