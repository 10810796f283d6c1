"""The slot pool's maintenance seen from a command: a pass of the reaper now (`rollouts reap`)."""

from __future__ import annotations

from temporalio.client import Client

from activities.pool import MaintenanceReport
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.store_claim import claim_queue
from workflows.pool import SlotPoolMaintenanceWorkflow


async def reap_now(client: Client, settings: Settings) -> MaintenanceReport:
    """A pass of the slot-pool maintenance workflow, now: restart dead containers, free leases of closed
    rollouts, stop idle containers. A worker of the queue runs it."""
    handle = await claim_queue(client, settings)
    return MaintenanceReport.model_validate(await handle.execute_update(SlotPoolMaintenanceWorkflow.pass_now))
