"""`rollouts`: start batches, watch them, inspect slots, serve the demo policy.

Everything here can also be done with the `temporal` CLI or the Temporal UI: a batch
is a `BatchWorkflow` on task queue `rollouts` started with plain JSON input.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.service import RPCError

from temporal_rollouts import cli_inspect
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError, RolloutError
from temporal_rollouts.core.records import BatchInput, BatchProgress, BatchResult, RolloutLimits, TrajectoryInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import connect

DEMO_ENV = "terminal_tasks"


def _batch_input(args: argparse.Namespace) -> BatchInput:
    limits = RolloutLimits(max_turns=args.max_turns) if args.max_turns else RolloutLimits()
    return BatchInput(
        env=args.env, num_items=args.items, group_size=args.group_size, item_offset=args.offset,
        policy=args.policy, limits=limits, max_concurrency=args.max_concurrency, output=args.output,
        env_config=json.loads(args.env_config) if args.env_config else {},
    )


async def start_batch(client: Client, settings: Settings, batch: BatchInput, batch_id: str | None = None) -> WorkflowHandle:
    from workflows.batch import BatchWorkflow

    return await client.start_workflow(
        BatchWorkflow.run, batch, id=batch_id or f"batch-{batch.env}-{uuid.uuid4().hex[:8]}",
        task_queue=settings.temporal.task_queue,
    )


async def _progress(handle: WorkflowHandle) -> BatchProgress | None:
    raw = await handle.query("progress")
    return BatchProgress.model_validate(raw) if raw else None


async def watch(handle: WorkflowHandle, console: Console) -> BatchResult:
    """A progress bar until the batch finishes; returns its result."""
    columns = (SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
               TextColumn("{task.fields[detail]}"), TimeElapsedColumn())
    result_task = asyncio.ensure_future(handle.result())
    with Progress(*columns, console=console, transient=False) as bar:
        task = bar.add_task(handle.id, total=None, detail="loading items")
        while not result_task.done():
            try:
                progress = await _progress(handle)
            except RPCError:
                progress = None
            if progress:
                mean = progress.mean_score
                detail = f"running {progress.running}  failed {progress.failed}  mean score " + (
                    f"{mean:.2f}" if mean is not None else "-")
                bar.update(task, total=progress.total, completed=progress.completed + progress.failed, detail=detail)
            await asyncio.wait({result_task}, timeout=0.5)
        result = BatchResult.model_validate(result_task.result())
        bar.update(task, total=result.total, completed=result.completed + result.failed, detail="done")
    return result


def summary_json(result: BatchResult) -> dict[str, Any]:
    return {
        "batch_id": result.batch_id, "env": result.env, "total": result.total, "completed": result.completed,
        "failed": result.failed, "mean_score": result.mean_score, "stop_reasons": result.stop_reasons,
        "output": result.output, "groups_written": result.groups_written,
        "groups_pending": result.groups_pending, "resumed": result.resumed,
    }


def print_summary(result: BatchResult, console: Console, settings: Settings) -> None:
    table = Table(title=f"batch {result.batch_id}", show_header=False)
    table.add_row("rollouts", f"{result.total} ({result.completed} scored, {result.failed} failed)")
    table.add_row("mean score", f"{result.mean_score:.3f}" if result.mean_score is not None else "-")
    table.add_row("stop reasons", ", ".join(f"{k}: {v}" for k, v in sorted(result.stop_reasons.items())))
    table.add_row("groups written", str(result.groups_written))
    if result.groups_pending:
        table.add_row("groups pending", f"{result.groups_pending} (a member failed: `rollouts resume {result.batch_id}`)")
    if result.resumed:
        table.add_row("resumed", str(result.resumed))
    console.print(table)
    console.print(f"results:     {result.output}", soft_wrap=True)
    if settings.ui_url:
        page = f"{settings.ui_url}/namespaces/{settings.temporal.namespace}/workflows/{result.batch_id}"
        console.print(f"Temporal UI: {page}", soft_wrap=True)


async def _warn_without_worker(client: Client, settings: Settings, console: Console) -> None:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    try:
        described = await client.workflow_service.describe_task_queue(DescribeTaskQueueRequest(
            namespace=settings.temporal.namespace, task_queue=TaskQueue(name=settings.temporal.task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        ))
    except RPCError:
        return
    if not described.pollers:
        console.print(f"[yellow]no worker polls task queue {settings.temporal.task_queue!r}: "
                      "start one with `python worker.py`[/yellow]")


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    console = Console(stderr=args.json)
    client = await connect(settings)
    handle = await start_batch(client, settings, _batch_input(args), args.id)
    if not args.wait:
        if args.json:
            print(json.dumps({"batch_id": handle.id, "status": "running"}))
        else:
            console.print(f"started {handle.id}; watch it with `rollouts status {handle.id}`")
        return 0
    await _warn_without_worker(client, settings, console)
    return await _finish(handle, console, settings, as_json=args.json)


async def _finish(handle: WorkflowHandle, console: Console, settings: Settings, *, as_json: bool,
                  extra: dict[str, Any] | None = None) -> int:
    try:
        result = await watch(handle, console)
    except WorkflowFailureError as err:
        message = f"batch {handle.id} failed: {err.cause}"
        print(json.dumps({"batch_id": handle.id, "error": message}) if as_json else message)
        return 1
    if as_json:
        print(json.dumps({**summary_json(result), **(extra or {})}))
    else:
        print_summary(result, console, settings)
    return 0 if result.failed == 0 else 2


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_embedded=False)
    handle = client.get_workflow_handle(args.batch_id)
    described = await handle.describe()
    if described.status == WorkflowExecutionStatus.COMPLETED:
        result = BatchResult.model_validate(await handle.result())
        data = {**summary_json(result), "status": "completed"}
    else:
        progress = await _progress(handle)
        data = {"batch_id": args.batch_id, "status": described.status.name.lower() if described.status else "unknown"}
        if progress:
            data |= {"total": progress.total, "completed": progress.completed, "failed": progress.failed,
                     "running": progress.running, "mean_score": progress.mean_score,
                     "stop_reasons": progress.stop_reasons, "output": progress.output}
    if args.json:
        print(json.dumps(data))
    else:
        for key, value in data.items():
            print(f"{key:>14}: {value}")
    return 0


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The main job on the embedded default: a worker in this process, a demo batch, a summary."""
    from worker import running_worker

    console = Console()
    console.print("[bold]temporal-rollouts demo[/bold]: terminal tasks played by the demo policy "
                  "(a scripted test policy that replays reference solutions, not a model)")
    async with running_worker(settings) as client:
        batch = BatchInput(env=DEMO_ENV, num_items=args.items, group_size=args.group_size)
        handle = await start_batch(client, settings, batch)
        code = await _finish(handle, console, settings, as_json=False)
    if settings.embedded:
        console.print("The Temporal server, sandbox and demo policy keep running for the UI and later batches; "
                      "`rollouts server stop` stops them.")
    return code


async def cmd_slots(args: argparse.Namespace, settings: Settings) -> int:
    from temporal_rollouts.sandbox.pool import SandboxPool

    pool = SandboxPool.from_settings(settings)
    try:
        containers = await pool.describe()
    finally:
        await pool.aclose()
    if args.json:
        print(json.dumps([c.model_dump(mode="json") for c in containers]))
        return 0
    table = Table("container", "slot", "state", "holder", "expires in (s)")
    for container in containers:
        for slot in container.slots:
            lease = slot.lease
            table.add_row(container.container_id, str(slot.slot), "leased" if lease else "free",
                          lease.holder.workflow_id if lease else "", f"{lease.expires_at - time.time():.0f}" if lease else "")
    Console().print(table)
    return 0


CLOSED_UNSUCCESSFULLY = ("Failed", "Terminated", "TimedOut", "Canceled")


async def _started_input(client: Client, handle: WorkflowHandle, model: type[BaseModel]) -> BaseModel:
    """The input a run was started with, read from its history."""
    history = await handle.fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [value] = await client.data_converter.decode(payloads, [model])
    return value


async def _failed_rollouts(client: Client, batch_id: str) -> list[str]:
    """Rollouts of a batch whose latest run failed, timed out, was terminated or cancelled."""
    statuses = " OR ".join(f"ExecutionStatus = '{status}'" for status in CLOSED_UNSUCCESSFULLY)
    query = f"RolloutBatchId = '{batch_id}' AND WorkflowType = 'TrajectoryWorkflow' AND ({statuses})"
    candidates = sorted({execution.id async for execution in client.list_workflows(query)})
    failed = []
    for rollout in candidates:
        described = await client.get_workflow_handle(rollout).describe()
        if described.status != WorkflowExecutionStatus.RUNNING and described.status != WorkflowExecutionStatus.COMPLETED:
            failed.append(rollout)
    return failed


async def resume_rollout(client: Client, settings: Settings, rollout: str) -> dict[str, Any]:
    """A new run of the rollout that continues where its latest run stopped."""
    from workflows.trajectory import TrajectoryWorkflow

    handle = client.get_workflow_handle(rollout)
    described = await handle.describe()
    original = await _started_input(client, client.get_workflow_handle(rollout, run_id=described.run_id), TrajectoryInput)
    resumed = original.model_copy(update={"resume_from_run": described.run_id})
    new = await client.start_workflow(
        TrajectoryWorkflow.run, resumed, id=rollout, task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, memo={"resumed_from_run": described.run_id},
        search_attributes=TypedSearchAttributes([
            SearchAttributePair(sa.ENV, original.env), SearchAttributePair(sa.ITEM_ID, original.item.id),
            *([SearchAttributePair(sa.BATCH_ID, original.batch_id)] if original.batch_id else []),
        ]),
    )
    return {"rollout_id": rollout, "resumed_from_run": described.run_id, "run_id": new.result_run_id}


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume a failed rollout, or every failed rollout of a batch and gather its groups again."""
    from workflows.batch import BatchWorkflow

    console = Console(stderr=args.json)
    client = await connect(settings)
    handle = client.get_workflow_handle(args.id)
    described = await handle.describe()
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise ConfigError(f"{args.id} is still running; resume it once it has stopped")
    if described.workflow_type == "TrajectoryWorkflow":
        resumed = await resume_rollout(client, settings, args.id)
        if args.json:
            print(json.dumps(resumed))
        else:
            console.print(f"resumed {resumed['rollout_id']} from run {resumed['resumed_from_run']} "
                          f"as run {resumed['run_id']}")
        return 0
    if described.workflow_type != "BatchWorkflow":
        raise ConfigError(f"{args.id} is a {described.workflow_type}, not a batch or a rollout")
    failed = await _failed_rollouts(client, args.id)
    original = await _started_input(client, client.get_workflow_handle(args.id, run_id=described.run_id), BatchInput)
    batch = original.model_copy(update={"resume": True, "cursor": None})
    new = await client.start_workflow(
        BatchWorkflow.run, batch, id=args.id, task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE, memo={"resumed_from_run": described.run_id},
    )
    if not args.json:
        console.print(f"resuming {len(failed)} rollout(s) of {args.id}: " + (", ".join(failed) or "none"))
        console.print(f"the batch gathers its groups again as run {new.result_run_id}")
    if not args.wait:
        if args.json:
            print(json.dumps({"batch_id": args.id, "run_id": new.result_run_id, "resumed": failed}))
        return 0
    return await _finish(new, console, settings, as_json=args.json, extra={"resumed": failed})


async def cmd_reap(args: argparse.Namespace, settings: Settings) -> int:
    """One pass of the reaper schedule's workflow, now: restart dead containers, free leases
    of closed rollouts, stop idle containers."""
    from activities.pool import MaintenanceReport
    from workflows.pool import SlotPoolMaintenanceWorkflow

    console = Console(stderr=args.json)
    client = await connect(settings)
    await _warn_without_worker(client, settings, console)
    raw = await client.execute_workflow(
        SlotPoolMaintenanceWorkflow.run, id=f"rollouts-slot-reaper-manual-{uuid.uuid4().hex[:8]}",
        task_queue=settings.temporal.task_queue,
    )
    report = MaintenanceReport.model_validate(raw)
    if args.json:
        print(report.model_dump_json())
        return 0
    console.print(f"reaped {len(report.reaped)} lease(s) of closed rollouts")
    for lease in report.reaped:
        console.print(f"  {lease.container_id} slot {lease.slot}: {lease.holder.workflow_id} ({lease.holder.run_id})")
    if report.stopped_containers:
        console.print(f"stopped idle containers: {', '.join(report.stopped_containers)}")
    console.print(f"health: {json.dumps(report.health)}")
    return 0


async def cmd_worker(args: argparse.Namespace, settings: Settings) -> int:
    from worker import main_async

    await main_async(settings)
    return 0


async def cmd_server(args: argparse.Namespace, settings: Settings) -> int:
    """The embedded Temporal server; `stop` also stops the local sandbox containers and demo policy."""
    from temporal_rollouts.runtime.services import stop_demo_policy
    from temporal_rollouts.runtime.temporal import ensure_dev_server, stop_dev_server
    from temporal_rollouts.sandbox.backends.local import LocalBackend

    if args.action == "start":
        started = ensure_dev_server(settings)
        print(f"{'started' if started else 'already running'}: {settings.temporal_address} (UI {settings.ui_url})")
        return 0
    backend = LocalBackend.from_settings(settings)
    containers = await backend.list_containers()
    for container in containers:
        await backend.stop_container(container.container_id)
    print(f"sandbox containers stopped: {len(containers)}")
    print(f"demo policy: {'stopped' if stop_demo_policy(settings) else 'not running'}")
    print(f"Temporal server: {'stopped' if stop_dev_server(settings) else 'not running'}")
    return 0


def cmd_policy_serve(args: argparse.Namespace, settings: Settings) -> int:
    from temporal_rollouts.demo_policy import main as serve_main

    return serve_main(["--host", args.host, "--port", str(args.port or settings.demo_policy.port), *args.rest]) or 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rollouts", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser("demo", help="run a demo batch on the embedded default, start to finish")
    demo.add_argument("--items", type=int, default=12)
    demo.add_argument("--group-size", type=int, default=2)

    batch = sub.add_parser("batch", help="start a batch of rollouts")
    batch.add_argument("--env", required=True)
    batch.add_argument("--items", type=int, default=4)
    batch.add_argument("--group-size", type=int, default=2)
    batch.add_argument("--offset", type=int, default=0, help="index of the first item")
    batch.add_argument("--policy", default=None, help="policy name or OpenAI-compatible base URL")
    batch.add_argument("--max-turns", type=int, default=None)
    batch.add_argument("--max-concurrency", type=int, default=32)
    batch.add_argument("--env-config", default=None, help="JSON object passed to the env")
    batch.add_argument("--output", default=None, help="JSONL path for scored groups")
    batch.add_argument("--id", default=None, help="batch id (workflow id); generated when unset")
    batch.add_argument("--wait", action="store_true", help="show progress until the batch finishes")
    batch.add_argument("--json", action="store_true", help="print one JSON object on stdout")

    status = sub.add_parser("status", help="progress or result of a batch")
    status.add_argument("batch_id")
    status.add_argument("--json", action="store_true")

    slots = sub.add_parser("slots", help="sandbox containers, slots, leases and their holders")
    slots.add_argument("--json", action="store_true")

    resume = sub.add_parser("resume", help="resume a failed rollout, or the failed rollouts of a batch")
    resume.add_argument("id", help="a batch id or a rollout id")
    resume.add_argument("--wait", action="store_true", help="for a batch: show progress until it finishes")
    resume.add_argument("--json", action="store_true")

    reap = sub.add_parser("reap", help="run the slot reaper now")
    reap.add_argument("--json", action="store_true")

    sub.add_parser("worker", help="run a worker (same as `python worker.py`)")

    server = sub.add_parser("server", help="start or stop the embedded Temporal dev server")
    server.add_argument("action", choices=["start", "stop"])

    policy = sub.add_parser("policy", help="the demo policy")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    serve = policy_sub.add_parser("serve", help="serve the demo policy as an OpenAI-compatible server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("rest", nargs=argparse.REMAINDER, help="fault-injection flags, see python -m temporal_rollouts.demo_policy -h")

    cli_inspect.add_parsers(sub)
    return parser


COMMANDS = {"batch": cmd_batch, "status": cmd_status, "demo": cmd_demo, "slots": cmd_slots, "reap": cmd_reap,
            "resume": cmd_resume, "worker": cmd_worker, "server": cmd_server, **cli_inspect.COMMANDS}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = Settings()
        if args.command == "policy":
            return cmd_policy_serve(args, settings)
        return asyncio.run(COMMANDS[args.command](args, settings))
    except RolloutError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def run() -> None:
    """The `rollouts` command. It leaves with os._exit once its output is flushed: the Temporal
    client's native threads can abort the interpreter while it finalizes, which would turn a
    finished command into a crash and a wrong exit code."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
