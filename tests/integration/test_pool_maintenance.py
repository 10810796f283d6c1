"""The slot-pool maintenance workflow: one long-lived execution per task queue that runs a
pass, sleeps, and continues as new; started idempotently;
`rollouts reap` gets a pass now through an update. Real dev server, worker and sandbox."""

from __future__ import annotations

import logging
import uuid

import pytest
from temporalio.client import Client, WorkflowExecutionStatus

import workflows.pool as pool_workflow
from activities.pool import MaintenanceReport, PoolActivities
from activities.snapshots import SnapshotActivities
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.schedules import ensure_maintenance_workflow
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder
from tests.support.waiting import leased_slots, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture
async def maintenance_settings(settings: Settings, client: Client, monkeypatch) -> Settings:
    """A task-queue-wide maintenance workflow with a short period and short runs."""
    monkeypatch.setattr(pool_workflow, "PASSES_PER_RUN", 3)
    quick = settings.model_copy(update={"sandbox": settings.sandbox.model_copy(update={"reap_interval_s": 0.5})})
    yield quick
    await client.get_workflow_handle(f"{settings.temporal.task_queue}-slot-maintenance").terminate("test over")


async def test_one_long_lived_workflow_per_task_queue(client: Client, maintenance_settings: Settings) -> None:
    settings = maintenance_settings
    first = await ensure_maintenance_workflow(client, settings)
    again = await ensure_maintenance_workflow(client, settings)
    assert again.result_run_id == first.result_run_id  # idempotent: the running execution is kept

    handle = client.get_workflow_handle(first.id)
    # Three passes per run, one every 0.5 s: it continues as new and keeps counting.
    status = await wait_until(lambda: _passes_at_least(handle, 5), timeout_s=30)
    assert status["interval_s"] == 0.5
    described = await handle.describe()
    assert described.run_id != first.result_run_id and described.status == WorkflowExecutionStatus.RUNNING
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{first.id}'")]
    running = [e for e in runs if e.status == WorkflowExecutionStatus.RUNNING]
    assert len(running) == 1 and all(
        e.status in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW) for e in runs
    )


async def test_reap_now_frees_the_lease_of_a_holder_that_is_gone(
    client: Client, maintenance_settings: Settings, pool: SandboxPool
) -> None:
    hourly = maintenance_settings.model_copy(
        update={"sandbox": maintenance_settings.sandbox.model_copy(update={"reap_interval_s": 3600})}
    )
    handle = await ensure_maintenance_workflow(client, hourly)
    await wait_until(lambda: _passes_at_least(handle, 1), timeout_s=30)  # the first pass runs at start
    holder = Holder(workflow_id=f"gone-rollout-{uuid.uuid4().hex[:8]}/item-0/g0", run_id=str(uuid.uuid4()))
    leaked = await pool.acquire(holder, ttl_s=600, wait_s=10)
    report = MaintenanceReport.model_validate(
        await handle.execute_update(pool_workflow.SlotPoolMaintenanceWorkflow.pass_now)
    )
    assert leaked.lease_id in {lease.lease_id for lease in report.reaped}
    assert all(s.lease.holder != holder for s in await leased_slots(pool))
    assert (await handle.query("status"))["passes"] == 2  # the update's pass, not a periodic one


async def test_a_lease_given_back_while_it_was_reaped_is_no_warning(
    client: Client, settings: Settings, parts, pool: SandboxPool, caplog
) -> None:
    """The reaper lists a lease, then finds its holder closed: in between the rollout released the
    slot itself (its `finally`), as ordinary batches do all the time. Nothing is left to save."""
    activities = PoolActivities(pool, client, SnapshotActivities(pool, parts.objects, settings.storage))
    holder = Holder(workflow_id=f"closing-rollout-{uuid.uuid4().hex[:8]}/item-0/g0", run_id=str(uuid.uuid4()))
    lease = await pool.acquire(holder, ttl_s=600, wait_s=10)

    async def closed_just_after_releasing(candidate: Holder) -> bool:
        if candidate != holder:
            return False
        await pool.release(lease)
        return True

    caplog.set_level(logging.WARNING)
    freed = await pool.reap(closed_just_after_releasing, activities.save_workspace)
    assert lease.lease_id not in {f.lease_id for f in freed}
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def _passes_at_least(handle, count: int) -> dict | None:
    status = await handle.query("status")
    return status if status and status["passes"] >= count else None
