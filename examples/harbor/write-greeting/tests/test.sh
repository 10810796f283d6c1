#!/bin/bash
# Two parts, each worth half; reward.json carries both and the total. The agent's script runs as this test's
# child, so before the reward is written every process but this test and its ancestors is killed: nothing
# the script left running in the background can write /logs/verifier after the test did.
cd /workspace || exit 1
file=0; script=0
[ "$(cat greeting.txt 2>/dev/null)" = "hello, harbor" ] && file=1
[ -x greeting.sh ] && [ "$(timeout 10 ./greeting.sh 2>/dev/null)" = "hello, harbor" ] && script=1
keep=" $$ "; pid=$$
while [ "$pid" -gt 1 ]; do pid=$(sed 's/.*) [A-Za-z] \([0-9]*\).*/\1/' "/proc/$pid/stat"); keep="$keep$pid "; done
for entry in /proc/[0-9]*; do
    case "$keep" in *" ${entry#/proc/} "*) ;; *) kill -9 "${entry#/proc/}" 2>/dev/null ;; esac
done
case $((file + script)) in 2) reward=1.0 ;; 1) reward=0.5 ;; *) reward=0.0 ;; esac
rm -f /logs/verifier/reward.json /logs/verifier/reward.txt
printf '{"reward": %s, "file": %d, "script": %d}\n' "$reward" "$file" "$script" > /logs/verifier/reward.json
