"""The slot pool under real load: more rollouts than slots, and a sandbox server killed under
running rollouts. Each test runs its own `python worker.py` process and its own pool."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.state.lease_log import idle_while_waiting, read_lease_events, utilisation
from tests.support.processes import WorkerProcess, kill_servers_under
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import leased_slots, no_leases, wait_until
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

SLOTS = 2


@pytest.fixture
async def small_pool(settings: Settings, tmp_path: Path) -> AsyncIterator[tuple[Settings, SandboxPool, WorkerProcess]]:
    """One container of two slots that may not scale, behind its own worker process."""
    own = settings.model_copy(
        update={
            "data_dir": tmp_path / "data",
            "temporal": settings.temporal.model_copy(update={"task_queue": f"load-{uuid.uuid4().hex[:6]}"}),
            "sandbox": settings.sandbox.model_copy(update={"slots_per_container": SLOTS, "max_containers": 1}),
        }
    )
    worker = WorkerProcess(own, tmp_path / "worker.log")
    worker.start()
    worker.wait_ready()
    pool = SandboxPool.from_settings(own)
    yield own, pool, worker
    worker.stop()
    await pool.aclose()
    backend = LocalBackend.from_settings(own)
    for container in await backend.list_containers():
        await backend.stop_container(container.container_id)
    kill_servers_under(own.data_dir)


async def test_more_rollouts_than_slots_all_finish_and_no_slot_idles_while_one_waits(
    client: Client, small_pool, demo_policy: DemoPolicyProcess
) -> None:
    settings, pool, _ = small_pool
    started = time.time()
    result = BatchResult.model_validate(
        await client.execute_workflow(
            BatchWorkflow.run,
            BatchInput(env="echo_chain", num_items=8, group_size=1, env_config={"steps": 2, "sleep_s": 0.3}),
            id=f"saturate-{uuid.uuid4().hex[:6]}",
            task_queue=settings.temporal.task_queue,
        )
    )
    finished = time.time()

    assert (result.completed, result.failed, result.mean_score) == (8, 0, 1.0)
    assert await leased_slots(pool) == []
    [container] = await pool.fleet.refresh()
    events = read_lease_events(LocalBackend.from_settings(settings).container_dir(container.container_id) / "root")
    queued = [e for e in events if e.event == "queued"]
    assert len(queued) >= 8 - SLOTS, "the batch really waited for slots"
    handed = [e for e in events if e.event == "released" and e.handed_over]
    assert len(handed) >= 8 - SLOTS, "freed slots went straight to waiters"
    # A slot is never free while a rollout waits for one (apart from the hand-over itself).
    assert idle_while_waiting(events) < 0.5
    assert utilisation(events, SLOTS, started, finished) > 0.5


async def test_a_killed_sandbox_server_is_restarted_and_its_rollouts_finish(
    client: Client, small_pool, demo_policy: DemoPolicyProcess
) -> None:
    """The documented outcome: a local container that dies is restarted in place (same
    workspaces, leases and stored results); its rollouts retry the step that was cut and
    finish. A command that was killed mid-run had no result and runs again."""
    settings, pool, _ = small_pool
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=2, group_size=1, env_config={"steps": 3, "sleep_s": 1.0}),
        id=f"container-death-{uuid.uuid4().hex[:6]}",
        task_queue=settings.temporal.task_queue,
    )

    async def both_leased() -> bool:
        return len(await leased_slots(pool)) == SLOTS

    await wait_until(both_leased, timeout_s=30)
    [container] = await pool.fleet.refresh()
    os.kill(container.pid, signal.SIGKILL)

    result = BatchResult.model_validate(await handle.result())
    assert (result.completed, result.failed, result.mean_score) == (2, 0, 1.0)
    await wait_until(lambda: no_leases(pool), timeout_s=15)
    [restarted] = await pool.fleet.refresh()
    assert restarted.container_id == container.container_id and restarted.pid != container.pid
