"""The trainer door's endpoint as a real process (`python -m temporal_rollouts.door`), pointed at a
Temporal server and an object store folder, killable like any server of a training run."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.support.servers.process import HOST, LoopbackServer


class DoorProcess(LoopbackServer):
    what = "the door endpoint"

    def __init__(self, log_path: Path, temporal_address: str, data_dir: Path, key: str | None = None) -> None:
        super().__init__(log_path)
        self.temporal_address, self.data_dir, self.key = temporal_address, data_dir, key

    def start(self) -> None:
        env = {
            **os.environ,
            "ROLLOUTS_TEMPORAL__ADDRESS": self.temporal_address,
            "ROLLOUTS_DATA_DIR": str(self.data_dir),
        }
        argv = [sys.executable, "-m", "temporal_rollouts.door", "--host", HOST, "--port", str(self.port)]
        if self.key is not None:
            env["DOOR_TEST_KEY"] = self.key
            argv += ["--api-key-env", "DOOR_TEST_KEY"]
        self.launch(argv, env=env)
        self.wait_ready(wait_s=60)

    def kill(self) -> None:
        """SIGKILL: an endpoint that dies mid-request, with nothing to clean up."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)
