"""`python -m temporal_rollouts.sandbox_server`: one container's sandbox server."""

from temporal_rollouts.sandbox_server.http.app import main

main()
