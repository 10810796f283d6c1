"""The slot-pool maintenance workflow: one long-lived execution per task queue.

Every worker starts it at start-up, idempotently (an execution that is already running is
kept and told the current interval), and deletes the every-30-s reaper schedule of
earlier versions when it finds one: that schedule started a new workflow each period and
flooded the UI's workflow list. `rollouts reap` asks the running execution for a pass now.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.core.settings import Settings


def maintenance_workflow_id(settings: Settings) -> str:
    """One per task queue: `rollouts-slot-maintenance` on the default queue."""
    return f"{settings.temporal.task_queue}-slot-maintenance"


def reaper_schedule_id(settings: Settings) -> str:
    """The schedule earlier versions created (deleted when found)."""
    return f"{settings.temporal.task_queue}-slot-reaper"


async def delete_old_reaper_schedule(client: Client, settings: Settings) -> bool:
    try:
        await client.get_schedule_handle(reaper_schedule_id(settings)).delete()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return False
        raise
    return True


async def ensure_maintenance_workflow(
    client: Client, settings: Settings, memo: dict[str, Any] | None = None
) -> WorkflowHandle:
    """Start the maintenance workflow unless it runs; either way it uses the configured interval.
    `memo`: what the execution records if this call starts it (runtime/store_claim.py records the
    queue's store there); a running one keeps what the call that started it recorded."""
    from workflows.pool import MaintenanceInput, SlotPoolMaintenanceWorkflow

    await delete_old_reaper_schedule(client, settings)
    interval = settings.sandbox.reap_interval_s
    handle = await client.start_workflow(
        SlotPoolMaintenanceWorkflow.run,
        MaintenanceInput(interval_s=interval),
        id=maintenance_workflow_id(settings),
        task_queue=settings.temporal.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        memo=memo,
    )
    await handle.signal(SlotPoolMaintenanceWorkflow.set_interval, interval)
    return handle
