"""The reaper schedule: SlotPoolMaintenanceWorkflow every `sandbox.reap_interval_s`.

Created (or brought up to date) by every worker at start; idempotent.
"""

from __future__ import annotations

from datetime import timedelta

from temporalio.client import (
    Client,
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleAlreadyRunningError,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleUpdate,
    ScheduleUpdateInput,
)

from temporal_rollouts.core.settings import Settings


def reaper_schedule_id(settings: Settings) -> str:
    """One reaper per task queue: `rollouts-slot-reaper` on the default queue."""
    return f"{settings.temporal.task_queue}-slot-reaper"


def reaper_schedule(settings: Settings) -> Schedule:
    return Schedule(
        action=ScheduleActionStartWorkflow(
            "SlotPoolMaintenanceWorkflow",
            id=f"{reaper_schedule_id(settings)}-run",
            task_queue=settings.temporal.task_queue,
            execution_timeout=timedelta(minutes=5),
        ),
        spec=ScheduleSpec(intervals=[ScheduleIntervalSpec(every=timedelta(seconds=settings.sandbox.reap_interval_s))]),
        policy=SchedulePolicy(overlap=ScheduleOverlapPolicy.SKIP),
    )


async def ensure_reaper_schedule(client: Client, settings: Settings) -> None:
    schedule = reaper_schedule(settings)
    try:
        await client.create_schedule(reaper_schedule_id(settings), schedule)
    except ScheduleAlreadyRunningError:
        def update(_: ScheduleUpdateInput) -> ScheduleUpdate:
            return ScheduleUpdate(schedule=schedule)

        await client.get_schedule_handle(reaper_schedule_id(settings)).update(update)
