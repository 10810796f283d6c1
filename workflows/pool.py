"""SlotPoolMaintenanceWorkflow: one pass of pool upkeep, started by the reaper schedule.

A schedule (not a forever-running loop) so that the period shows and can be paused in
the Temporal UI, `rollouts reap` can run the same pass on demand, and a pass that
overlaps the previous one is skipped rather than queued.
"""

from __future__ import annotations

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.pool import MaintenanceReport, PoolActivities
    from workflows import params


@workflow.defn(name="SlotPoolMaintenanceWorkflow")
class SlotPoolMaintenanceWorkflow:
    @workflow.run
    async def run(self) -> MaintenanceReport:
        return await workflow.execute_activity_method(
            PoolActivities.maintain_slot_pool, **params.POOL_MAINTENANCE.options()
        )
