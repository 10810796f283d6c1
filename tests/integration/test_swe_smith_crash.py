"""A worker SIGKILLed during an swe_smith rollout's setup or verification costs that one step:
the rollout finishes on the restarted worker with score 1.0, and no sandbox operation of it
(archive copy, checkout, the grading command) ran twice."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from envs import get_env
from temporal_rollouts.core.records import TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.support.processes import WorkerProcess
from tests.support.sandbox import executions_under
from tests.support.waiting import no_leases, wait_until
from workflows.trajectory import TrajectoryWorkflow

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


@pytest.fixture
def crash_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={"temporal": settings.temporal.model_copy(update={"task_queue": f"swe-crash-{uuid.uuid4().hex[:6]}"})}
    )


@pytest.fixture
def worker_process(crash_settings: Settings, tmp_path: Path, pool: SandboxPool) -> Iterator[WorkerProcess]:
    process = WorkerProcess(crash_settings, tmp_path / "worker.log")
    process.start()
    process.wait_ready()
    yield process
    process.stop()


def executions(settings: Settings, prefix: str) -> list[dict]:
    return executions_under(settings.data_dir, prefix)


async def in_phase(handle: WorkflowHandle, phase: str) -> bool:
    try:
        return (await handle.query("progress"))["phase"] == phase
    except RPCError:
        return False


@pytest.mark.parametrize(("phase", "after_s"), [("setup", 0.3), ("verify", 4.0)])
async def test_worker_killed_during_setup_or_verify_the_rollout_finishes(
    phase: str,
    after_s: float,
    client: Client,
    crash_settings: Settings,
    worker_process: WorkerProcess,
    pool: SandboxPool,
) -> None:
    item = get_env("swe_smith").load_items(1)[0]
    handle = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="swe_smith", item=item),
        id=f"swe-crash-{phase}-{uuid.uuid4().hex[:6]}",
        task_queue=crash_settings.temporal.task_queue,
    )
    await wait_until(lambda: in_phase(handle, phase), timeout_s=120, interval_s=0.05)
    await asyncio.sleep(after_s)
    worker_process.restart()

    result = TrajectoryResult.model_validate(await asyncio.wait_for(handle.result(), 400))
    assert result.score == 1.0, result.verify_details
    assert result.verify_details["tests_passed"] and result.verify_details["installed"]
    ran = Counter(e["call_id"] for e in executions(crash_settings, f"{handle.id}/"))
    assert any(call.endswith("/grader-run") for call in ran), ran
    assert ran and set(ran.values()) == {1}, f"a sandbox operation ran twice: {ran}"
    await wait_until(lambda: no_leases(pool), timeout_s=15)
