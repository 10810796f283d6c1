"""Atropos' trajectory API as the trainer sees it: the real `run-api` console script
(from the atroposlib wheel) on a free loopback port, one process per test module, and
a trainer-side helper that registers and pulls batches."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from tests.support.servers.process import HOST, LoopbackServer


class RunApiProcess(LoopbackServer):
    what = "run-api"

    def start(self) -> None:
        self.launch([str(Path(sys.executable).parent / "run-api"), "--host", HOST, "--port", str(self.port)])
        self.wait_ready(wait_s=120)


async def register_trainer(api: TrajectoryApi, *, batch_size: int, max_token_len: int, checkpoint_dir: Path) -> None:
    """Register as a trainer and make the first `/batch` call, which is what lets envs register."""
    await api.register_trainer(
        wandb_group="tests",
        wandb_project="tests",
        batch_size=batch_size,
        max_token_len=max_token_len,
        checkpoint_dir=str(checkpoint_dir),
        save_checkpoint_interval=-1,
        starting_step=0,
        num_steps=100,
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
