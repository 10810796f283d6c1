"""`python worker.py`: a rollout worker.

With no Temporal address configured it starts (or finds) the embedded dev server, the
local sandbox container and the demo policy; with an address it connects there. It
registers the workflows and activities on task queue `rollouts` and runs until
SIGTERM or Ctrl-C, then drains: running activities get the graceful-shutdown period
to finish, and whatever is still running is handed back to Temporal to retry.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio.client import Client
from temporalio.worker import Worker

from activities.envs import EnvActivities
from activities.llm import LlmActivities
from activities.pool import PoolActivities
from activities.sinks import SinkActivities
from activities.slots import SlotActivities
from activities.tools import ToolActivities
from activities.verify import VerifyActivities
from activities.workspace import WorkspaceActivities
from rollouts.schedules import ensure_reaper_schedule
from rollouts.services import ensure_demo_policy
from rollouts.settings import Settings
from rollouts.temporal import connect
from sandboxes.pool import SandboxPool
from workflows.batch import BatchWorkflow
from workflows.pool import SlotPoolMaintenanceWorkflow
from workflows.trajectory import TrajectoryWorkflow

log = logging.getLogger("rollouts.worker")

WORKFLOWS = [BatchWorkflow, TrajectoryWorkflow, SlotPoolMaintenanceWorkflow]


def build_worker(client: Client, settings: Settings, pool: SandboxPool, llm: LlmActivities) -> Worker:
    slots = SlotActivities(pool, settings.sandbox)
    activities = [
        EnvActivities().load_items,
        slots.acquire_slot,
        slots.release_slot,
        WorkspaceActivities(pool).setup_workspace,
        llm.llm_turn,
        ToolActivities(pool).tool_call,
        VerifyActivities(pool).verify,
        SinkActivities(settings).open_sink,
        SinkActivities(settings).write_group,
        PoolActivities(pool, client, settings.sandbox).maintain_slot_pool,
    ]
    return Worker(
        client,
        task_queue=settings.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=activities,
        max_concurrent_activities=settings.worker.max_concurrent_activities,
        max_concurrent_workflow_tasks=settings.worker.max_concurrent_workflow_tasks,
        graceful_shutdown_timeout=timedelta(seconds=settings.worker.graceful_shutdown_s),
    )


@contextlib.asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[Client]:
    """Connect, start local services where configured, and run a worker until the block exits."""
    client = await connect(settings)
    if settings.embedded:
        await asyncio.to_thread(ensure_demo_policy, settings)
    pool = SandboxPool.from_settings(settings)
    llm = LlmActivities(settings, pool)
    try:
        await pool.ensure_running(settings.sandbox.min_containers)
        await ensure_reaper_schedule(client, settings)
        worker = build_worker(client, settings, pool, llm)
        async with worker:
            yield client
    finally:
        await llm.aclose()
        await pool.aclose()


async def main_async(settings: Settings) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_worker(settings):
        where = settings.temporal_address + (" (embedded)" if settings.embedded else "")
        log.info("worker polling task queue %r on %s; UI %s", settings.temporal.task_queue, where, settings.ui_url or "-")
        await stop.wait()
        log.info("draining: running activities get %.0fs to finish", settings.worker.graceful_shutdown_s)


def main() -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request drowns everything else
    asyncio.run(main_async(Settings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
