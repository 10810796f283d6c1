"""A crash costs one step, never a rollout or a slot: workers are SIGKILLed for real.

Workers here are `python worker.py` processes (tests/processes.py) on their own task
queue, sharing the session's Temporal dev server, sandbox container and demo policy.
"""

from __future__ import annotations

import asyncio
import random
import subprocess
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError

from temporal_rollouts.core.records import BatchInput, BatchResult, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.runtime.temporal import temporal_binary
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.support.processes import WorkerProcess
from tests.support.sandbox import executions_under
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import leased_slots, no_leases, wait_until
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.slow

STEP_S = 4.0  # how long the step under test takes, so the kill lands inside it


@pytest.fixture
def crash_settings(settings: Settings) -> Settings:
    return settings.model_copy(
        update={
            "temporal": settings.temporal.model_copy(update={"task_queue": f"crash-{uuid.uuid4().hex[:6]}"}),
            "sandbox": settings.sandbox.model_copy(update={"reap_interval_s": 2.0}),
        }
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


async def phase_of(handle: WorkflowHandle) -> str:
    try:
        phase = (await handle.query("progress"))["phase"]
        return phase
    except RPCError:
        return ""


PHASES = {
    "setup": ({"setup_sleep_s": STEP_S}, {}, "setup"),
    "model turn": ({}, {"delay_s": STEP_S}, "turn 1"),
    "tool call": ({"sleep_s": STEP_S}, {}, None),
    "verification": ({"verify_sleep_s": STEP_S}, {}, "verify"),
}


@pytest.mark.parametrize("phase", list(PHASES))
async def test_worker_killed_mid_step_the_rollout_finishes(
    phase: str,
    client: Client,
    crash_settings: Settings,
    worker_process: WorkerProcess,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    env_config, faults, marker = PHASES[phase]
    demo_policy.control(**faults)
    handle = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(
            env="echo_chain", item=Item(id=f"echo-{uuid.uuid4().int % 10**6}"), env_config={"steps": 2, **env_config}
        ),
        id=f"crash-{phase.replace(' ', '-')}-{uuid.uuid4().hex[:6]}",
        task_queue=crash_settings.temporal.task_queue,
    )
    if phase == "tool call":
        # A tool call is a local activity: it holds the workflow task, so a query waits until
        # it ends. The model and the sandbox tell instead: turn 1 was answered and the rollout's
        # slot is running a command.
        await wait_until(lambda: _running_a_tool_call(pool, demo_policy, handle.id), timeout_s=60, interval_s=0.05)
    else:
        await wait_until(lambda: _in_phase(handle, marker), timeout_s=60, interval_s=0.05)
    await asyncio.sleep(1.0)
    killed_at = time.monotonic()
    worker_process.restart()
    demo_policy.control(reset=True)  # the retried step runs at full speed

    result = TrajectoryResult.model_validate(await asyncio.wait_for(handle.result(), 90))
    recovery_s = time.monotonic() - killed_at

    assert result.score == 1.0, "each step appended exactly once, in order"
    assert result.turns == 3 and result.tool_calls == 2
    ran = Counter(e["call_id"] for e in executions(crash_settings, f"{handle.id}/"))
    assert ran and set(ran.values()) == {1}, f"a sandbox operation ran twice: {ran}"
    turns = next(iter(demo_policy.stats()["conversations"].values()), [])
    assert turns == sorted(turns), "a finished model turn was asked for again"
    assert recovery_s < 60
    await wait_until(lambda: no_leases(pool), timeout_s=15)


async def _in_phase(handle: WorkflowHandle, marker: str) -> bool:
    return await phase_of(handle) == marker


async def _running_a_tool_call(pool: SandboxPool, demo_policy: DemoPolicyProcess, workflow_id: str) -> bool:
    if demo_policy.stats()["total"] < 1:
        return False
    return any(s.busy and s.lease.holder.workflow_id == workflow_id for s in await leased_slots(pool))


async def test_chaos_batch_survives_repeated_sigkills(
    client: Client,
    crash_settings: Settings,
    worker_process: WorkerProcess,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    """24 rollouts with distinct prompts; the worker is SIGKILLed at random moments 4 times."""
    demo_policy.control(delay_s=0.3)
    queue = crash_settings.temporal.task_queue
    batches = [
        BatchInput(env="terminal_tasks", num_items=16, group_size=1, max_concurrency=24),
        BatchInput(
            env="echo_chain", num_items=8, group_size=1, item_offset=1000, env_config={"steps": 3, "sleep_s": 0.2}
        ),
    ]
    handles = [
        await client.start_workflow(BatchWorkflow.run, b, id=f"chaos-{uuid.uuid4().hex[:6]}", task_queue=queue)
        for b in batches
    ]
    results_task = asyncio.ensure_future(asyncio.gather(*(h.result() for h in handles)))
    rng = random.Random(7)
    for _ in range(4):
        await asyncio.wait({results_task}, timeout=rng.uniform(1.5, 4.0))
        if results_task.done():
            break
        worker_process.restart()
        await asyncio.to_thread(worker_process.wait_ready)
    results = [BatchResult.model_validate(r) for r in await asyncio.wait_for(results_task, 240)]

    assert worker_process.kills >= 2, "the batch ended before the harness could kill the worker twice"
    assert sum(r.total for r in results) == 24
    assert [(r.completed, r.failed, r.mean_score) for r in results] == [(16, 0, 1.0), (8, 0, 1.0)]
    await wait_until(lambda: no_leases(pool), timeout_s=15)

    for handle in handles:
        ran = Counter(e["call_id"] for e in executions(crash_settings, f"{handle.id}/"))
        assert ran and max(ran.values()) == 1, "a tool call ran twice"
    conversations = demo_policy.stats()["conversations"]
    rollout_turns = await _turns_per_rollout(client, handles, results)
    assert len(conversations) == 24
    for turns in conversations.values():
        assert turns == sorted(turns), "a finished model turn was asked for again"
    # Each kill can lose at most one in-flight model turn per rollout.
    assert sum(len(t) for t in conversations.values()) <= sum(rollout_turns) + worker_process.kills * 24
    for turns in conversations.values():
        assert max(Counter(turns).values()) <= 1 + worker_process.kills


async def _turns_per_rollout(client: Client, handles: list[WorkflowHandle], results: list[BatchResult]) -> list[int]:
    turns = []
    for handle, result in zip(handles, results):
        for index in range(result.total):
            raw = await client.get_workflow_handle(f"{handle.id}/item-{index}/g0").result()
            turns.append(TrajectoryResult.model_validate(raw).turns)
    return turns


async def test_terminated_rollouts_get_their_slots_back_after_one_reaper_period(
    client: Client,
    crash_settings: Settings,
    worker_process: WorkerProcess,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    demo_policy.control(delay_s=60)
    handles = [
        await client.start_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(env="echo_chain", item=Item(id=f"echo-{n}")),
            id=f"terminate-{uuid.uuid4().hex[:6]}",
            task_queue=crash_settings.temporal.task_queue,
        )
        for n in range(2)
    ]
    ids = {h.id for h in handles}

    async def both_leased() -> bool:
        return ids <= {s.lease.holder.workflow_id for s in await leased_slots(pool)}

    await wait_until(both_leased, timeout_s=30)
    for handle in handles:
        subprocess.run(
            [
                temporal_binary(),
                "workflow",
                "terminate",
                "--address",
                crash_settings.temporal_address,
                "--workflow-id",
                handle.id,
                "--reason",
                "test",
            ],
            check=True,
            capture_output=True,
            timeout=30,
        )
    terminated_at = time.monotonic()

    async def freed() -> bool:
        return not ids & {s.lease.holder.workflow_id for s in await leased_slots(pool)}

    await wait_until(freed, timeout_s=3 * crash_settings.sandbox.reap_interval_s + 10)
    assert time.monotonic() - terminated_at < 3 * crash_settings.sandbox.reap_interval_s + 10
