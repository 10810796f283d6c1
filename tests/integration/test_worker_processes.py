"""`python worker.py` with `worker.processes = 2`: two processes poll the queue and both run
rollouts; one that dies is started again; SIGTERM stops them all."""

from __future__ import annotations

import asyncio
import os
import signal
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from tests.support.processes import WorkerProcess
from tests.support.waiting import wait_until
from workflows.batch import BatchWorkflow, rollout_id

pytestmark = pytest.mark.slow


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                    found.add(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
    return found


def worker_children(pid: int) -> set[int]:
    """Live worker processes started by `pid` (`python -m temporal_rollouts.runtime.worker`); one that exits
    between the listing and the read is not one."""
    found = set()
    for child in children_of(pid):
        try:
            if b"temporal_rollouts.runtime.worker" in Path(f"/proc/{child}/cmdline").read_bytes():
                found.add(child)
        except OSError:
            continue
    return found


async def test_two_worker_processes_share_the_queue_and_stop_together(
    client: Client,
    settings: Settings,
    tmp_path: Path,
) -> None:
    own = settings.model_copy(
        update={
            "temporal": settings.temporal.model_copy(update={"task_queue": f"processes-{uuid.uuid4().hex[:6]}"}),
            "worker": settings.worker.model_copy(update={"processes": 2}),
        }
    )
    worker = WorkerProcess(own, tmp_path / "worker.log")
    worker.start()
    try:
        await asyncio.to_thread(worker.wait_ready, 60)
        assert worker.proc is not None

        async def both_ready() -> bool:
            return _ready_count(worker.log_path) >= 2

        await wait_until(both_ready, timeout_s=60)
        [child] = worker_children(worker.proc.pid)

        batch = BatchInput(env="echo_chain", num_items=16, group_size=1, max_concurrency=16, env_config={"steps": 3})
        batch_id = f"processes-{uuid.uuid4().hex[:6]}"
        result = BatchResult.model_validate(
            await client.execute_workflow(BatchWorkflow.run, batch, id=batch_id, task_queue=own.temporal.task_queue)
        )
        assert (result.completed, result.failed) == (16, 0)
        pids = await _activity_worker_pids(client, batch_id, 16)
        assert pids == {worker.proc.pid, child}, "both processes ran steps"

        os.kill(child, signal.SIGKILL)  # a dead helper process is started again

        async def started_again() -> bool:
            return len(worker_children(worker.proc.pid) - {child}) == 1

        await wait_until(started_again, timeout_s=30)
        [again] = worker_children(worker.proc.pid)
        worker.stop()  # SIGTERM: the first process stops the other and drains
        assert worker.proc.returncode == 0
        assert not Path(f"/proc/{again}").exists() or _zombie(again)
    finally:
        worker.stop()


def _ready_count(log_path: Path) -> int:
    return log_path.read_text().count("worker polling task queue") if log_path.exists() else 0


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


async def _activity_worker_pids(client: Client, batch_id: str, items: int) -> set[int]:
    """The pids (from `pid@host` identities) of the workers that started the rollouts' activities."""
    pids = set()
    for index in range(items):
        history = await client.get_workflow_handle(rollout_id(batch_id, index, 0)).fetch_history()
        for event in history.events:
            if event.HasField("activity_task_started_event_attributes"):
                pids.add(int(event.activity_task_started_event_attributes.identity.partition("@")[0]))
    return pids
