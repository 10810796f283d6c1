"""The bundled task that needs the stateful terminal, through the real worker with the demo policy."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client

from envs import get_env
from temporal_rollouts.core.records import StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder
from tests.support.sandbox import needs_bubblewrap, processes_running
from tests.support.waiting import leased_slots, wait_until
from workflows.trajectory import TrajectoryWorkflow

pytestmark = [pytest.mark.slow, needs_bubblewrap]

TASK = "serve-status-page"
SERVER = "http.server 8080"


@pytest.mark.host_lock("http-server-8080")  # waits until no process on the host is SERVER
async def test_the_server_task_passes_through_the_worker_and_its_server_dies_with_the_slot(
    client: Client, settings: Settings, pool: SandboxPool
) -> None:
    result: TrajectoryResult = await client.execute_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="terminal_tasks", item=Item(id=TASK)),
        id=f"rollout-{uuid.uuid4().hex[:8]}",
        task_queue=settings.temporal.task_queue,
    )
    assert result.stop_reason is StopReason.COMPLETED
    assert result.score == 1.0, result.verify_details
    assert result.verify_details["output"].strip().endswith("OK")
    assert result.tool_calls == 2 and result.tool_errors == []
    assert result.tool_stats.model_dump() == {
        "attempted": 2,
        "schema_valid": 2,
        "executed_ok": 2,
        "execution_errors": 0,
    }
    assert await leased_slots(pool) == []

    async def server_gone() -> bool:
        return not processes_running(SERVER)

    await wait_until(server_gone, timeout_s=10)


async def test_the_server_task_fails_untouched_and_with_the_one_shot_terminal(pool: SandboxPool) -> None:
    env = get_env("terminal_tasks")
    item = Item(id=TASK)
    lease = await pool.acquire(Holder(workflow_id=f"untouched-{uuid.uuid4().hex[:6]}"), ttl_s=120, wait_s=30)
    try:
        meta = await env.setup_workspace(item, LeasedSlot(pool, lease, "untouched/setup"))
        verdict = await env.verify(item, LeasedSlot(pool, lease, "untouched/verify", meta=meta), [])
        assert verdict.score == 0.0 and "FAIL: nothing answers on port 8080" in verdict.details["output"]
        one_shot = LeasedSlot(pool, lease, "one-shot/tools")
        started = await one_shot.terminal("cd site && (python3 -m http.server 8080 >/dev/null 2>&1 &) && sleep 1")
        assert started.ok
        verdict = await env.verify(item, LeasedSlot(pool, lease, "one-shot/verify", meta=meta), [])
        assert verdict.score == 0.0, "a server started by a one-shot command is gone when that command ends"
    finally:
        await pool.release(lease)
