"""The slot pool seen from a command: its containers with their image and slots (`rollouts slots`, the
view), and a pass of the reaper now (`rollouts reap`)."""

from __future__ import annotations

from temporalio.client import Client

from activities.pool import MaintenanceReport
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.pool import ContainerSlots, SandboxPool
from temporal_rollouts.runtime.store_claim import claim_queue
from workflows.pool import SlotPoolMaintenanceWorkflow


async def reap_now(client: Client, settings: Settings) -> MaintenanceReport:
    """A pass of the slot-pool maintenance workflow, now: restart dead containers, free leases of closed
    rollouts, stop idle containers. A worker of the queue runs it."""
    handle = await claim_queue(client, settings)
    return MaintenanceReport.model_validate(await handle.execute_update(SlotPoolMaintenanceWorkflow.pass_now))


async def describe_sandboxes(settings: Settings) -> list[ContainerSlots]:
    """Every live container of the configured pool, with its image and its slots, asked of the servers now."""
    pool = SandboxPool.from_settings(settings)
    try:
        return await pool.describe()
    finally:
        await pool.aclose()
