"""`python -m temporal_rollouts.door`: the trainer door's endpoint (server.py)."""

from temporal_rollouts.door.server import main
from temporal_rollouts.runtime.exit_codes import exit_flushed

exit_flushed(main)
