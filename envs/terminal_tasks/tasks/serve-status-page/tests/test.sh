#!/bin/bash
# This task's result is a server the agent left running, and every verifier that stops the agent's processes
# first (the `harbor` env's does) finds none. So no reward is written: under such a verifier the task is
# unverifiable, never a 0 the agent earned. The env `terminal_tasks` checks it in the agent's own shell
# (`[metadata] check_in_session`), where check.sh sees the server.
echo "serve-status-page checks the agent's running server: verify it with the env terminal_tasks (check_in_session)"
exit 1
