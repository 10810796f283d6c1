"""Atropos' trajectory API as the trainer sees it: the real `run-api` console script
(from the atroposlib wheel) on a free loopback port, one process per test module, and
a trainer-side helper that registers and pulls batches."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from integrations.atropos.api import TrajectoryApi
from rollouts.services import wait_for_port


class RunApiProcess:
    def __init__(self, port: int, log_path: Path) -> None:
        self.port = port
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        run_api = Path(sys.executable).parent / "run-api"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([str(run_api), "--host", "127.0.0.1", "--port", str(self.port)],
                                         stdout=log, stderr=subprocess.STDOUT)
        wait_for_port("127.0.0.1", self.port, self.proc, "run-api", self.log_path, wait_s=120)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)


async def register_trainer(api: TrajectoryApi, *, batch_size: int, max_token_len: int, checkpoint_dir: Path) -> None:
    """Register as a trainer and make the first `/batch` call, which is what lets envs register."""
    await api.register_trainer(
        wandb_group="tests", wandb_project="tests", batch_size=batch_size, max_token_len=max_token_len,
        checkpoint_dir=str(checkpoint_dir), save_checkpoint_interval=-1, starting_step=0, num_steps=100,
    )
    assert await api.batch() is None, "nothing is queued before any env posted"


async def pull_batch(api: TrajectoryApi, timeout_s: float) -> list[dict]:
    """Poll `/batch` as a trainer does until a full batch is there."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        if (batch := await api.batch()) is not None:
            return batch
        await asyncio.sleep(0.25)
    raise TimeoutError(f"no batch from run-api within {timeout_s:.0f}s")
