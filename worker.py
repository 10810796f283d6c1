"""`python worker.py`: a rollout worker (temporal_rollouts/runtime/worker.py builds and runs it).

With no Temporal address configured it starts (or finds) the embedded dev server, the
local sandbox container and the demo policy; with an address it connects there. It runs
until SIGTERM or Ctrl-C, then drains.
"""

import sys

from temporal_rollouts.runtime.worker import main

if __name__ == "__main__":
    sys.exit(main())
