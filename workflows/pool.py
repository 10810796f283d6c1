"""SlotPoolMaintenanceWorkflow: pool upkeep, one long-lived workflow per task queue.

It runs a pass (restart dead containers, free leases of closed rollouts, stop idle
containers), sleeps `interval_s`, and runs the next, continuing as new every
PASSES_PER_RUN passes so its history stays short. One execution per task queue, started
idempotently by every worker (runtime/schedules.py), so the UI's workflow list shows one
row for it instead of a new run every 30 s as the schedule it replaces did. `rollouts
reap` runs a pass now through the `pass_now` update and gets that pass's report back.
"""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel, Field
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.pool import MaintenanceReport, PoolActivities
    from temporal_rollouts.core.inputs import checked_input
    from workflows import params
    from workflows.upgrades import continue_on_current_build, time_to_continue

PASSES_PER_RUN = 200
"""Passes before continuing as new (each pass adds about 6 events)."""


class MaintenanceInput(BaseModel):
    interval_s: float = Field(default=30.0, gt=0, description="Seconds between passes.")
    passes: int = Field(default=0, description="Passes run by earlier runs of this chain (for the query).")


@workflow.defn(name="SlotPoolMaintenanceWorkflow")
class SlotPoolMaintenanceWorkflow:
    def __init__(self) -> None:
        self._passes = 0  # passes finished
        self._started = 0  # passes started
        self._wanted = 0  # passes asked for through `pass_now`, beyond the periodic ones
        self._last: MaintenanceReport | None = None
        self._interval_s: float | None = None

    @workflow.run
    @checked_input
    async def run(self, input: MaintenanceInput) -> None:
        self._interval_s = input.interval_s
        self._passes = self._started = input.passes
        for _ in range(PASSES_PER_RUN):
            await self._pass()
            try:
                await workflow.wait_condition(lambda: self._wanted > 0, timeout=timedelta(seconds=self._interval_s))
            except TimeoutError:  # the period is over
                pass
            if time_to_continue():
                break
        while self._wanted or not workflow.all_handlers_finished():  # `pass_now` callers are answered first
            if self._wanted:
                await self._pass()
            else:
                await workflow.wait_condition(lambda: self._wanted > 0 or workflow.all_handlers_finished())
        workflow.continue_as_new(
            MaintenanceInput(interval_s=self._interval_s, passes=self._passes),
            initial_versioning_behavior=continue_on_current_build(),
        )

    async def _pass(self) -> MaintenanceReport:
        self._wanted = 0
        self._started += 1
        self._last = await workflow.execute_activity_method(
            PoolActivities.maintain_slot_pool, **params.POOL_MAINTENANCE.options()
        )
        self._passes += 1
        return self._last

    @workflow.update
    async def pass_now(self) -> MaintenanceReport:
        """Run a pass that starts after this request (not the one in progress) and return its report."""
        target = self._started + 1
        self._wanted += 1
        await workflow.wait_condition(lambda: self._passes >= target)
        assert self._last is not None
        return self._last

    @workflow.signal
    def set_interval(self, interval_s: float) -> None:
        if interval_s > 0:
            self._interval_s = interval_s

    @workflow.query
    def status(self) -> dict:
        return {
            "passes": self._passes,
            "interval_s": self._interval_s,
            "last": self._last.model_dump(mode="json") if self._last else None,
        }
