"""`python -m temporal_rollouts.view`: the web page `rollouts view` serves (serve.py)."""

from temporal_rollouts.runtime.exit_codes import exit_flushed
from temporal_rollouts.view.serve import main

exit_flushed(main)
