"""Slot-pool maintenance: restart dead containers, free leases of closed rollouts, stop idle containers.

Run by the reaper schedule and by `rollouts reap`. The reaper is the second line of
defence against leaked slots (the first is release in `finally`, the last is lease
expiry): a lease whose holder workflow run has closed, for whatever reason, is freed,
after its workspace is saved for a resume.
"""

from __future__ import annotations

import logging
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from activities.snapshots import SnapshotActivities
from temporal_rollouts.core.errors import LeaseLost, activity_boundary
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder, SlotLease
from temporal_rollouts.storage.snapshots import snapshot_key

log = logging.getLogger(__name__)


class MaintenanceReport(BaseModel):
    health: dict[str, Any] = Field(default_factory=dict)
    reaped: list[SlotLease] = Field(default_factory=list)
    stopped_containers: list[str] = Field(default_factory=list)


class PoolActivities:
    def __init__(self, pool: SandboxPool, client: Client, snapshots: SnapshotActivities) -> None:
        self._pool = pool
        self._client = client
        self._snapshots = snapshots

    async def holder_closed(self, holder: Holder) -> bool:
        """True when the lease's holder run can no longer use it. Leases held outside a
        workflow (no workflow id) are left to lease expiry."""
        if not holder.workflow_id:
            return False
        handle = self._client.get_workflow_handle(holder.workflow_id, run_id=holder.run_id or None)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return True
            raise
        return described.status != WorkflowExecutionStatus.RUNNING

    async def save_workspace(self, lease: SlotLease) -> None:
        """A closed holder never released its slot (terminated, or its worker died for good):
        keep its workspace so that `rollouts resume` can continue the rollout. A lease the holder
        gave back since the reaper listed it (its own release, as it closed) has nothing to save."""
        holder = lease.holder
        if not (holder.workflow_id and holder.run_id):
            return
        try:
            await self._snapshots.save(lease, snapshot_key(holder.workflow_id, holder.run_id))
        except LeaseLost:
            log.debug(
                "slot %d of %s was released by %s itself before it was reaped",
                lease.slot,
                lease.container_id,
                holder.workflow_id,
            )

    @activity.defn(name="maintain_slot_pool")
    async def maintain_slot_pool(self) -> MaintenanceReport:
        with activity_boundary():
            health = await self._pool.fleet.check_health()
            reaped = await self._pool.reap(self.holder_closed, self.save_workspace)
            stopped = await self._pool.fleet.scale_down()
            return MaintenanceReport(health=health.model_dump(mode="json"), reaped=reaped, stopped_containers=stopped)
