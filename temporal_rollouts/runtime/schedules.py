"""The slot-pool maintenance workflow: one long-lived execution per task queue.

Every worker starts it at start-up, idempotently (an execution that is already running is
kept and told the current interval). `rollouts reap` asks the running execution for a pass now.
"""

from __future__ import annotations

from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy

from temporal_rollouts.core.settings import Settings


def maintenance_workflow_id(settings: Settings) -> str:
    """One per task queue: `rollouts-slot-maintenance` on the default queue."""
    return f"{settings.temporal.task_queue}-slot-maintenance"


async def ensure_maintenance_workflow(
    client: Client, settings: Settings, memo: dict[str, Any] | None = None
) -> WorkflowHandle:
    """Start the maintenance workflow unless it runs; either way it uses the configured interval.
    `memo`: what the execution records if this call starts it (runtime/store_claim.py records the
    queue's store there); a running one keeps what the call that started it recorded."""
    from workflows.pool import MaintenanceInput, SlotPoolMaintenanceWorkflow

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
