"""Forks and branches are as durable as rollouts: a SIGKILLed worker, a model outage, a resume.

Workers here are `python worker.py` processes on their own task queue (as in test_crash.py),
sharing the session's dev server, sandbox container and demo policy.
"""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from temporal_rollouts.client.forks import start_fork
from temporal_rollouts.core.records import BatchInput, BatchResult, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.core.trees import RolloutTreeResult
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.integration.test_resume import rollouts_cli
from tests.support.processes import WorkerProcess
from tests.support.sandbox import executions_under
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import leased_slots, no_leases, wait_until
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.slow


@pytest.fixture
def crash_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "temporal": settings.temporal.model_copy(update={"task_queue": f"fork-crash-{uuid.uuid4().hex[:6]}"}),
        }
    )


@pytest.fixture
def worker_process(crash_settings: Settings, tmp_path: Path, pool: SandboxPool) -> Iterator[WorkerProcess]:
    process = WorkerProcess(crash_settings, tmp_path / "worker.log")
    process.start()
    process.wait_ready()
    yield process
    process.stop()


async def tree_size(handle: WorkflowHandle) -> int:
    try:
        return len(await handle.query("tree"))
    except RPCError:
        return 0


def ran_once(settings: Settings, prefix: str) -> bool:
    ran = Counter(e["call_id"] for e in executions_under(settings.data_dir, prefix))
    return bool(ran) and set(ran.values()) == {1}


async def test_a_worker_killed_while_a_batch_branches_loses_no_branch_and_no_slot(
    client: Client,
    crash_settings: Settings,
    worker_process: WorkerProcess,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    demo_policy.control(delay_s=0.3)
    batch = BatchInput(
        env="echo_chain", env_config={"steps": 3}, num_items=1, group_size=2, branch={"at_turns": [1, 2], "factor": 2}
    )
    handle = await client.start_workflow(
        BatchWorkflow.run,
        batch,
        id=f"branch-crash-{uuid.uuid4().hex[:6]}",
        task_queue=crash_settings.temporal.task_queue,
    )
    tree = client.get_workflow_handle(f"{handle.id}/item-0/tree")
    await wait_until(lambda: _more_than(tree, 2), timeout_s=60, interval_s=0.05)  # the first branch was asked for
    worker_process.restart()
    await asyncio.to_thread(worker_process.wait_ready)

    result = BatchResult.model_validate(await asyncio.wait_for(handle.result(), 180))
    assert (result.completed, result.failed, result.mean_score) == (8, 0, 1.0), result
    assert ran_once(crash_settings, f"{handle.id}/"), "a tool call ran twice"
    await wait_until(lambda: no_leases(pool), timeout_s=15)


async def _more_than(tree: WorkflowHandle, count: int) -> bool:
    return await tree_size(tree) > count


async def test_a_worker_killed_during_a_replay_finishes_the_fork_and_runs_each_call_once(
    client: Client,
    crash_settings: Settings,
    worker_process: WorkerProcess,
    pool: SandboxPool,
) -> None:
    source = TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(env="echo_chain", item=Item(id="echo-4242"), env_config={"steps": 3, "sleep_s": 1.5}),
            id=f"replayed-{uuid.uuid4().hex[:6]}",
            task_queue=crash_settings.temporal.task_queue,
        )
    )
    handle, _, (root, _branch) = await start_fork(client, crash_settings, source.rollout_id, 3, 2)

    async def replaying() -> bool:
        try:
            return (await client.get_workflow_handle(root).query("progress"))["phase"] == "rebuild"
        except RPCError:
            return False

    await wait_until(replaying, timeout_s=60, interval_s=0.05)
    await asyncio.sleep(1.0)  # inside the second of three 1.5 s calls
    worker_process.restart()
    await asyncio.to_thread(worker_process.wait_ready)

    tree = RolloutTreeResult.model_validate(await asyncio.wait_for(handle.result(), 120))
    assert [r.score for r in tree.results] == [1.0, 1.0]
    assert tree.results[0].fork and tree.results[0].fork.replayed_calls == 3
    assert ran_once(crash_settings, f"{root}/"), "a replayed call ran twice"
    await wait_until(lambda: no_leases(pool), timeout_s=15)


async def test_branches_failed_by_a_model_outage_resume_alone_or_with_their_batch(
    client: Client,
    settings: Settings,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    demo_policy.control(delay_s=0.5)
    batch_id = f"branch-outage-{uuid.uuid4().hex[:6]}"
    batch = BatchInput(
        env="echo_chain", env_config={"steps": 3}, num_items=1, group_size=2, branch={"at_turns": [1], "factor": 2}
    )
    handle = await client.start_workflow(BatchWorkflow.run, batch, id=batch_id, task_queue=settings.temporal.task_queue)
    tree = client.get_workflow_handle(f"{batch_id}/item-0/tree")
    await wait_until(lambda: _more_than(tree, 3), timeout_s=60, interval_s=0.05)
    demo_policy.control(delay_s=0, fail_next=10_000, fail_status=503, retry_after=0.01)  # the model server goes down
    failed = BatchResult.model_validate(await handle.result())
    assert failed.failed == 4 and failed.groups_pending == 1, failed
    assert await leased_slots(pool) == []

    demo_policy.reset()
    branch = f"{batch_id}/item-0/g0/t1b1"
    await rollouts_cli(settings, "resume", branch, "--json")
    alone = TrajectoryResult.model_validate(await client.get_workflow_handle(branch).result())
    assert alone.score == 1.0 and alone.fork and alone.fork.parent == f"{batch_id}/item-0/g0" and alone.resumed_from_run

    summary = await rollouts_cli(settings, "resume", batch_id, "--wait", "--json")
    assert (summary["completed"], summary["failed"], summary["groups_written"]) == (4, 0, 1), summary
    assert summary["mean_score"] == 1.0
    assert await leased_slots(pool) == []
