"""The rollout worker: its parts, its Temporal worker, and the command `python worker.py` runs.

With no Temporal address configured it starts (or finds) the embedded dev server, the
local sandbox container and the demo policy; with an address it connects there. It
registers the workflows and activities on task queue `rollouts` and runs until
SIGTERM or Ctrl-C, then drains: running activities get the graceful-shutdown period
to finish, and whatever is still running is handed back to Temporal to retry.

`worker.py` at the top of the repository, `rollouts worker` and `python -m
temporal_rollouts.runtime.worker` all run `main` here; `rollouts demo`, the benchmarks and
the tests build the same worker with `running_worker` or `polling_worker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from datetime import timedelta

from temporalio.client import Client
from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.worker import (
    FixedSizeSlotSupplier,
    ResourceBasedSlotConfig,
    UnsandboxedWorkflowRunner,
    Worker,
    WorkerTuner,
)
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.envs import EnvActivities
from activities.feed import FeedActivities
from activities.fork_points import ForkPoints
from activities.forks import ForkActivities
from activities.images import ImageActivities
from activities.harness import HarnessActivities
from activities.llm import LlmActivities
from activities.pool import PoolActivities
from activities.resume import ResumeActivities
from activities.sinks import SinkActivities
from activities.slots import SlotActivities
from activities.snapshots import SnapshotActivities
from activities.tools import ToolActivities
from activities.verify import VerifyActivities
from activities.workspace import WorkspaceActivities
from envs.sources import load_env_sources
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings, WorkerSettings
from temporal_rollouts.runtime.cluster_checks import check_local_backend_is_alone, warn_about_local_storage
from temporal_rollouts.runtime.config import load_settings, with_env_modules
from temporal_rollouts.runtime.exit_codes import EXIT_ERROR
from temporal_rollouts.runtime.logs import configure_logging
from temporal_rollouts.runtime.loop_lag import LoopLag, LoopLagSlotSupplier
from temporal_rollouts.runtime.preflight import check_local_sandboxes
from temporal_rollouts.runtime.services import ensure_demo_policy
from temporal_rollouts.runtime.store_claim import claim_queue
from temporal_rollouts.runtime.temporal import connect, metrics_runtime
from temporal_rollouts.runtime.versioning import become_current_if_newest, deployment_config, worker_version
from temporal_rollouts.runtime.worker_processes import WorkerProcesses
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sinks.groups import GroupBuilder
from temporal_rollouts.storage.feed_groups import FeedGroupStore
from temporal_rollouts.storage.objects import S3ObjectClient, object_client
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import TranscriptStore
from workflows.batch import BatchWorkflow
from workflows.feed import TrainingFeedWorkflow
from workflows.pool import SlotPoolMaintenanceWorkflow
from workflows.trajectory import TrajectoryWorkflow
from workflows.tree import RolloutTreeWorkflow

log = logging.getLogger("temporal_rollouts.worker")

WORKFLOWS = [BatchWorkflow, TrajectoryWorkflow, RolloutTreeWorkflow, TrainingFeedWorkflow, SlotPoolMaintenanceWorkflow]


class Parts:
    """What activities are handed when the worker is built."""

    def __init__(self, settings: Settings, objects: S3StorageDriverClient | None = None) -> None:
        self.settings = settings
        self.objects = objects or object_client(settings)
        cache_bytes = settings.storage.cache_mib * 1024 * 1024
        self.transcripts = TranscriptStore(self.objects, settings.storage.bucket, cache_bytes)
        self.traces = TokenTraceStore(self.objects, settings.storage.bucket, cache_bytes)
        self.pool = SandboxPool.from_settings(settings)
        self.llm = LlmActivities(settings, self.transcripts, self.traces, self.pool)

    async def aclose(self) -> None:
        await self.llm.aclose()
        await self.pool.aclose()
        if isinstance(self.objects, S3ObjectClient):
            await self.objects.aclose()


def build_activities(client: Client, parts: Parts) -> list:
    settings, pool, transcripts = parts.settings, parts.pool, parts.transcripts
    slots = SlotActivities(pool, settings.sandbox)
    sinks = SinkActivities(settings, GroupBuilder(transcripts, parts.traces))
    snapshots = SnapshotActivities(pool, parts.objects, settings.storage)
    resume = ResumeActivities(client, parts.objects, settings.storage)
    feed = FeedActivities(
        settings,
        client,
        GroupBuilder(transcripts, parts.traces),
        FeedGroupStore(parts.objects, settings.storage.bucket),
    )
    fork_points = ForkPoints(client, transcripts, parts.traces, parts.objects, settings.storage.bucket)
    forks = ForkActivities(client, pool, transcripts, parts.objects, settings.storage)
    harness = HarnessActivities(settings, pool, transcripts)
    return [
        EnvActivities(settings).load_items,
        ImageActivities(pool).build_image,
        slots.acquire_slot,
        slots.release_slot,
        WorkspaceActivities(pool, transcripts).setup_workspace,
        parts.llm.llm_turn,
        ToolActivities(pool, transcripts).tool_call,
        harness.start_harness,
        harness.next_harness_call,
        harness.answer_harness_call,
        harness.stop_harness,
        VerifyActivities(pool, transcripts).verify,
        snapshots.snapshot_workspace,
        snapshots.restore_workspace,
        resume.load_resume_point,
        resume.rollout_outcome,
        resume.await_rollout,
        resume.started_input,
        fork_points.load_fork_point,
        forks.copy_workspace,
        forks.replay_tool_calls,
        sinks.open_sink,
        sinks.write_group,
        PoolActivities(pool, client, snapshots).maintain_slot_pool,
        feed.check_feed,
        feed.trainer_view,
        feed.post_feed_group,
        feed.check_feed_rollouts,
    ]


def build_worker(client: Client, parts: Parts) -> Worker:
    """The worker `python worker.py` runs.

    Workflow code runs unsandboxed unless `worker.sandboxed_workflows` is set: the sandbox
    imports the workflow modules afresh for every run and guards the stdlib on every
    workflow task, CPU that a 2-core worker needs for steps. Our workflows are
    deterministic and import only pass-through modules; a test replays a rollout's
    history under the sandboxed runner to catch a call that would break that."""
    settings = parts.settings
    load_envs(settings)
    return Worker(
        client,
        task_queue=settings.temporal.task_queue,
        workflows=WORKFLOWS,
        activities=build_activities(client, parts),
        **task_slots(settings.worker),
        max_cached_workflows=settings.worker.max_cached_workflows,
        sticky_queue_schedule_to_start_timeout=timedelta(seconds=settings.worker.sticky_queue_timeout_s),
        workflow_runner=SandboxedWorkflowRunner()
        if settings.worker.sandboxed_workflows
        else UnsandboxedWorkflowRunner(),
        graceful_shutdown_timeout=timedelta(seconds=settings.worker.graceful_shutdown_s),
        deployment_config=deployment_config(settings),
    )


@contextlib.asynccontextmanager
async def polling_worker(client: Client, parts: Parts) -> AsyncIterator[Worker]:
    """The worker, polling, its build made the current one where `worker.become_current` says so
    (runtime/versioning.py): from then on new batches and rollouts go to this build."""
    async with build_worker(client, parts) as worker:
        await become_current_if_newest(client, parts.settings)
        yield worker


def load_envs(settings: Settings) -> None:
    """The envs of installed packages' entry points and of `env_modules`, besides the bundled ones; a source that
    fails is one line, and the worker runs with the envs of the others."""
    for problem in load_env_sources(settings.env_modules):
        log.warning("%s; the worker runs without it", problem.line())


def task_slots(worker: WorkerSettings) -> dict:
    """The Worker arguments that bound how many tasks it runs at once (worker.slot_supplier)."""
    if worker.slot_supplier == "fixed":
        return {
            "max_concurrent_activities": worker.max_concurrent_activities,
            "max_concurrent_local_activities": worker.max_concurrent_local_activities,
            "max_concurrent_workflow_tasks": worker.max_concurrent_workflow_tasks,
        }
    if worker.slot_supplier == "loop_lag":
        lag = LoopLag()

        def keeping_up(most: int) -> LoopLagSlotSupplier:
            return LoopLagSlotSupplier(lag, most, max_lag_s=worker.max_loop_lag_s)

        return {
            "tuner": WorkerTuner.create_composite(
                workflow_supplier=keeping_up(worker.max_concurrent_workflow_tasks),
                activity_supplier=keeping_up(worker.max_concurrent_activities),
                local_activity_supplier=keeping_up(worker.max_concurrent_local_activities),
                nexus_supplier=FixedSizeSlotSupplier(1),
            )
        }

    def upto(most: int) -> ResourceBasedSlotConfig:
        return ResourceBasedSlotConfig(minimum_slots=min(2, most), maximum_slots=most)

    return {
        "tuner": WorkerTuner.create_resource_based(
            target_memory_usage=worker.target_memory,
            target_cpu_usage=worker.target_cpu,
            workflow_config=upto(worker.max_concurrent_workflow_tasks),
            activity_config=upto(worker.max_concurrent_activities),
            local_activity_config=upto(worker.max_concurrent_local_activities),
        )
    }


@contextlib.asynccontextmanager
async def running_worker(settings: Settings) -> AsyncIterator[Client]:
    """Connect, start local services where configured, and run a worker until the block exits."""
    check_local_sandboxes(settings)  # before anything starts: a machine that cannot sandbox says what fixes it
    parts = Parts(settings)
    try:
        client = await connect(settings, objects=parts.objects, runtime=metrics_runtime(settings))
        warn_about_local_storage(settings)
        await check_local_backend_is_alone(client, settings)
        await claim_queue(client, settings)  # this queue's store: recorded, or compared; before anything starts
        if settings.embedded:
            await asyncio.to_thread(ensure_demo_policy, settings)
        await parts.pool.fleet.backend.prepare()
        await parts.pool.fleet.ensure_running(settings.sandbox.min_containers)
        async with polling_worker(client, parts):
            yield client
    finally:
        await parts.aclose()


async def main_async(settings: Settings, verbose: bool = False) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with running_worker(settings):
        where = settings.temporal_address + (" (embedded)" if settings.embedded else "")
        build = worker_version(settings).build_id if settings.worker.versioning else "unversioned"
        log.info(
            "worker polling task queue %r (build %s) on %s; UI %s",
            settings.temporal.task_queue,
            build,
            where,
            settings.ui_url or "-",
        )
        if settings.worker.processes > 1:
            more = ["--verbose"] if verbose else []
            command = ["-m", "temporal_rollouts.runtime.worker", *more]
            await WorkerProcesses(settings, settings.worker.processes - 1, command).run(stop)
        else:
            await stop.wait()
        log.info("draining: running activities get %.0fs to finish", settings.worker.graceful_shutdown_s)


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python worker.py",
        description="A rollout worker: it connects to Temporal (or starts the embedded dev server), starts the "
        "local services, runs until SIGTERM or Ctrl-C, then drains.",
        epilog="Configured by rollouts.toml or ROLLOUTS_* environment variables (docs/settings.md).",
    )
    parser.add_argument(
        "--processes",
        type=int,
        metavar="N",
        help="worker processes on this machine (settings worker.processes; one per core uses them all)",
    )
    parser.add_argument(
        "--env-module",
        action="append",
        dest="env_modules",
        metavar="MODULE",
        help="load the envs of this module (a name on the import path, or a .py file) besides the bundled ones and "
        "installed packages' (repeatable; adds to settings env_modules)",
    )
    parser.add_argument(
        "--verbose",
        action="store_true",
        help="print full tracebacks on the console too (they always go to <data_dir>/logs/worker.log)",
    )
    args = parser.parse_args(argv)
    try:
        if args.processes is not None:  # checked and reported as the setting it stands for
            os.environ["ROLLOUTS_WORKER__PROCESSES"] = str(args.processes)
        settings = with_env_modules(load_settings(), args.env_modules)
        check_local_sandboxes(settings)  # a machine that cannot sandbox: one line, nothing made, not even the log
        log_file = configure_logging(settings.data_dir, verbose=args.verbose)
        log.info("logging to %s (one line per failed attempt here, tracebacks there)", log_file)
        asyncio.run(main_async(settings, verbose=args.verbose))
    except ConfigError as err:  # bad settings, or refused at start (no sandbox, another data folder's queue, ...)
        print(f"error: {err.message}", file=sys.stderr)
        return EXIT_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
