"""`rollouts`: start batches, watch them, inspect slots, serve the demo policy.

Everything here can also be done with the `temporal` CLI or the Temporal UI: a batch
is a `BatchWorkflow` on task queue `rollouts` started with plain JSON input. The parser,
the batch and server commands live here; cli_progress.py (the progress display, status,
exit codes), cli_resume.py and cli_inspect.py (show, export, list, cancel, view) hold the rest.
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

from pydantic import ValidationError
from rich.console import Console
from rich.table import Table
from temporalio.client import Client, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.cli import envs as cli_envs
from temporal_rollouts.cli import fork as cli_fork
from temporal_rollouts.cli import inspect as cli_inspect
from temporal_rollouts.cli import train as cli_train
from temporal_rollouts.cli import versions as cli_versions
from temporal_rollouts.cli.help_format import DefaultsHelpFormatter
from temporal_rollouts.cli.progress import (  # noqa: F401  (re-exported: the exit codes and status are the CLI's)
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_USAGE,
    batch_exit_code,
    batch_status,
    finish,
    format_status,
    status_exit_code,
)
from temporal_rollouts.cli.records import describe_or_none
from temporal_rollouts.cli.resume import cmd_resume
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import InvalidInput, RolloutError
from temporal_rollouts.core.inputs import parse_input
from temporal_rollouts.core.records import BatchInput
from temporal_rollouts.core.settings import DEMO_POLICY, Settings
from temporal_rollouts.runtime.config import load_settings, with_env_modules
from temporal_rollouts.runtime.temporal import connect

DEMO_ENV = "terminal_tasks"


def resolve_policy(settings: Settings, policy: str | None) -> str:
    """The policy a batch runs on, decided here when it starts: the CLI's own `default_policy`
    when none is named, checked against the CLI's settings (the worker resolves the name to an
    endpoint, so no URL secret or key enters the workflow)."""
    name = policy or settings.default_policy
    settings.policy_endpoint(name)  # raises ConfigError naming the known policies
    return name


def _batch_input(args: argparse.Namespace, settings: Settings) -> BatchInput:
    limits = {"max_turns": args.max_turns} if args.max_turns else {}
    known = cli_envs.env_is_known(args.env, settings)  # unknown here: the worker checks it in the first step
    fields = {
        "env": args.env,
        "num_items": args.items,
        "group_size": args.group_size,
        "item_offset": args.offset,
        "cycle_items": args.cycle,
        "policy": resolve_policy(settings, args.policy),
        "limits": limits,
        "max_concurrency": args.max_concurrency,
        "start_rate": args.start_rate,
        "output": args.output,
        "env_config": _json_option("--env-config", args.env_config) if args.env_config else {},
    }
    batch = parse_input(BatchInput, fields, "BatchWorkflow")  # the same checks and words as the workflow's own
    if known:
        _check_items(batch)
    return batch


def _check_items(batch: BatchInput) -> None:
    """The batch's first step checks this too; here it is refused before anything starts."""
    from activities.envs import check_items_fit
    from envs.registry import get_env

    item_count = get_env(batch.env, batch.env_config).item_count()
    check_items_fit(batch.env, item_count, batch.num_items, batch.item_offset, batch.cycle_items)


def _json_option(flag: str, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{flag}: not valid JSON ({err})") from None


async def start_batch(
    client: Client, settings: Settings, batch: BatchInput, batch_id: str | None = None
) -> WorkflowHandle:
    from workflows.batch import BatchWorkflow

    if batch.branch is not None:  # its rollouts carry RolloutForkedFrom, which an older server may lack
        from temporal_rollouts.runtime.registration import add_missing_search_attributes

        await add_missing_search_attributes(client, settings.temporal.namespace)
    attributes = [SearchAttributePair(sa.ENV, batch.env)]
    if batch.policy:
        attributes.append(SearchAttributePair(sa.POLICY, batch.policy))
    workflow_id = batch_id or f"batch-{batch.env}-{uuid.uuid4().hex[:8]}"

    async def start() -> WorkflowHandle:
        return await client.start_workflow(
            BatchWorkflow.run,
            batch,
            id=workflow_id,
            task_queue=settings.temporal.task_queue,
            search_attributes=TypedSearchAttributes(attributes),
        )

    try:
        return await start()
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT or "search attribute" not in err.message.lower():
            raise
        from temporal_rollouts.runtime.registration import add_missing_search_attributes

        if not await add_missing_search_attributes(client, settings.temporal.namespace):
            raise
        return await start()


async def _warn_without_worker(client: Client, settings: Settings, console: Console) -> None:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    try:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=settings.temporal.namespace,
                task_queue=TaskQueue(name=settings.temporal.task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
    except RPCError:
        return
    if not described.pollers:
        console.print(
            f"[yellow]no worker polls task queue {settings.temporal.task_queue!r}: "
            "start one with `python worker.py`[/yellow]"
        )


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    console = Console(stderr=args.json)
    batch = _batch_input(args, settings)  # a bad input is refused before anything is started or connected
    client = await connect(settings)
    if settings.embedded and batch.policy == DEMO_POLICY:
        # `rollouts server stop` stopped it with the server; bring both back, not only the server
        from temporal_rollouts.runtime.services import ensure_demo_policy

        await asyncio.to_thread(ensure_demo_policy, settings)
    handle = await start_batch(client, settings, batch, args.id)
    if not args.wait:
        if args.json:
            print(json.dumps({"batch_id": handle.id, "status": "running"}))
        else:
            console.print(f"started {handle.id}; watch it with `rollouts status {handle.id}`")
        return 0
    await _warn_without_worker(client, settings, console)
    return await finish(client, handle, console, settings, as_json=args.json, policy=batch.policy)


async def cmd_status(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_embedded=False)
    described = await describe_or_none(client, args.batch_id)
    if described is not None and described.workflow_type == cli_train.FEED:  # a training run: its own figures
        status = await cli_train.feed_status(client, args.batch_id)
        print(status.model_dump_json() if args.json else cli_train.format_feed(status))
        return 0
    data = await batch_status(client, args.batch_id)
    print(json.dumps(data) if args.json else format_status(data))
    return status_exit_code(data)


def demo_batch(args: argparse.Namespace, settings: Settings) -> BatchInput:
    """The demo's batch, its policy decided here as `rollouts batch` decides it, so it is labelled."""
    batch = BatchInput(
        env=DEMO_ENV, num_items=args.items, group_size=args.group_size, policy=resolve_policy(settings, None)
    )
    _check_items(batch)
    return batch


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The main job on the embedded default: a worker in this process, a demo batch, a summary."""
    from temporal_rollouts.runtime.preflight import check_local_sandboxes
    from worker import running_worker

    check_local_sandboxes(settings)  # one line naming the fix, before anything is printed or started
    console = Console()
    console.print(
        "[bold]temporal-rollouts demo[/bold]: terminal tasks played by the demo policy "
        "(a scripted test policy that replays reference solutions, not a model)"
    )
    batch = demo_batch(args, settings)  # refused before a worker or server is started
    async with running_worker(settings) as client:
        handle = await start_batch(client, settings, batch)
        code = await finish(client, handle, console, settings, as_json=False, policy=batch.policy)
    if settings.embedded:
        console.print(
            "The Temporal server, sandbox and demo policy keep running for the UI and later batches; "
            "`rollouts server stop` stops them."
        )
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
    console = Console()
    console.print(f"data folder: {settings.data_dir}", soft_wrap=True)
    if not containers:
        console.print(
            f"no sandbox containers are registered under {settings.data_dir}: start a worker "
            "(`python worker.py`) with this config, or point ROLLOUTS_DATA_DIR / ROLLOUTS_CONFIG at its data"
        )
        return 0
    table = Table("container", "slot", "state", "holder", "expires in (s)")
    for container in containers:
        for slot in container.slots:
            lease = slot.lease
            state = "leased" if lease else "quarantined" if slot.quarantined else "free"
            table.add_row(
                container.container_id,
                str(slot.slot),
                state,
                lease.holder.workflow_id if lease else "",
                f"{lease.expires_at - time.time():.0f}" if lease else "",
            )
    console.print(table)
    return 0


async def cmd_reap(args: argparse.Namespace, settings: Settings) -> int:
    """A pass of the slot-pool maintenance workflow, now: restart dead containers, free leases
    of closed rollouts, stop idle containers."""
    from activities.pool import MaintenanceReport
    from temporal_rollouts.runtime.schedules import ensure_maintenance_workflow
    from workflows.pool import SlotPoolMaintenanceWorkflow

    console = Console(stderr=args.json)
    client = await connect(settings)
    await _warn_without_worker(client, settings, console)
    handle = await ensure_maintenance_workflow(client, settings)
    raw = await handle.execute_update(SlotPoolMaintenanceWorkflow.pass_now)
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
    """The embedded Temporal server; `stop` also stops the pool's sandbox containers (on whichever backend
    is configured: local processes, Nomad jobs, Modal sandboxes; a static pool is left alone) and the demo policy."""
    from temporal_rollouts.runtime.services import stop_demo_policy
    from temporal_rollouts.runtime.temporal import ensure_dev_server, stop_dev_server
    from temporal_rollouts.sandbox.backends.select import build_backend

    if args.action == "start":
        started = ensure_dev_server(settings)
        print(f"{'started' if started else 'already running'}: {settings.temporal_address} (UI {settings.ui_url})")
        return 0
    stopped = await build_backend(settings).shutdown()
    print(f"sandbox containers stopped ({settings.sandbox.backend.type}): {len(stopped)}")
    print(f"demo policy: {'stopped' if stop_demo_policy(settings) else 'not running'}")
    print(f"Temporal server: {'stopped' if stop_dev_server(settings) else 'not running'}")
    return 0


def cmd_policy_serve(args: argparse.Namespace, settings: Settings) -> int:
    from temporal_rollouts.policy_servers.demo import main as serve_main

    modules = [arg for module in settings.env_modules for arg in ("--env-module", module)]
    return (
        serve_main(["--host", args.host, "--port", str(args.port or settings.demo_policy.port), *modules, *args.rest])
        or 0
    )


def _int_at_least(minimum: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    return parse


positive_int = _int_at_least(1)
non_negative_int = _int_at_least(0)


def _env_names() -> str:
    from envs.registry import env_names

    return ", ".join(sorted(env_names()))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollouts",
        description=__doc__.splitlines()[0],
        epilog=f"exit codes: {EXIT_OK} all rollouts scored, {EXIT_ERROR} the command failed, {EXIT_USAGE} usage error, "
        f"{EXIT_PARTIAL} some rollouts failed, {EXIT_FAILED} the batch failed",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    defaults = DefaultsHelpFormatter

    demo = sub.add_parser(
        "demo", help="run a demo batch on the embedded default, start to finish", formatter_class=defaults
    )
    demo.add_argument("--items", type=positive_int, default=12, help="terminal tasks to run")
    demo.add_argument("--group-size", type=positive_int, default=2, help="rollouts per task")
    cli_envs.add_env_module_flag(demo)

    batch = sub.add_parser(
        "batch",
        help="start a batch of rollouts",
        formatter_class=defaults,
        description=f"Start a batch of rollouts. Envs: {_env_names()}.",
    )
    batch.add_argument("--env", required=True, help=f"registered env: {_env_names()}")
    cli_envs.add_env_module_flag(batch)
    batch.add_argument("--items", type=positive_int, default=4, help="items of the env's task set")
    batch.add_argument(
        "--group-size", type=positive_int, default=2, help="rollouts per item (one scored group per item)"
    )
    batch.add_argument("--offset", type=non_negative_int, default=0, help="index of the first item")
    batch.add_argument(
        "--cycle",
        action="store_true",
        help="go round the task set again when --items runs past its end (repeats tasks)",
    )
    batch.add_argument(
        "--policy",
        default=None,
        help="policy name (from `policies`, or `demo`) or OpenAI-compatible base URL; "
        "default: the config's default_policy",
    )
    batch.add_argument("--max-turns", type=positive_int, default=None, help="model turns per rollout (default 30)")
    batch.add_argument("--max-concurrency", type=positive_int, default=32, help="rollouts running at once")
    batch.add_argument(
        "--start-rate",
        type=float,
        default=0,
        help="rollouts started per second at most; 0 starts them as fast as the batch can",
    )
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

    cli_envs.add_env_module_flag(sub.add_parser("worker", help="run a worker (same as `python worker.py`)"))

    server = sub.add_parser("server", help="start or stop the embedded Temporal dev server")
    server.add_argument("action", choices=["start", "stop"])

    policy = sub.add_parser("policy", help="the demo policy")
    policy_sub = policy.add_subparsers(dest="policy_command", required=True)
    serve = policy_sub.add_parser("serve", help="serve the demo policy as an OpenAI-compatible server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument(
        "rest",
        nargs=argparse.REMAINDER,
        help="fault-injection flags, see python -m temporal_rollouts.policy_servers.demo -h",
    )

    cli_inspect.add_parsers(sub)
    cli_train.add_parser(sub)
    cli_fork.add_parser(sub)
    cli_versions.add_parser(sub)
    cli_envs.add_parser(sub)
    return parser


COMMANDS = {
    "batch": cmd_batch,
    "status": cmd_status,
    "demo": cmd_demo,
    "slots": cmd_slots,
    "reap": cmd_reap,
    "resume": cmd_resume,
    "worker": cmd_worker,
    "server": cmd_server,
    "train": cli_train.cmd_train,
    "fork": cli_fork.cmd_fork,
    "envs": cli_envs.cmd_envs,
    **cli_inspect.COMMANDS,
    **cli_versions.COMMANDS,
}


def explain_rpc_error(err: RPCError, settings: Settings | None) -> str:
    where = settings.temporal_address if settings else "Temporal"
    if err.status == RPCStatusCode.NOT_FOUND:
        return f"not found on {where}: {err.message}"
    if err.status == RPCStatusCode.UNAVAILABLE:
        hint = (
            " (start it with `python worker.py` or `rollouts server start`)" if settings and settings.embedded else ""
        )
        return f"Temporal at {where} is not reachable{hint}: {err.message}"
    return f"Temporal at {where} answered {err.status.name if err.status else 'an error'}: {err.message}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command == "policy":  # the demo policy's own fault flags (--fail-rate 0.2, ...)
        args.rest = [*unknown, *args.rest]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    settings: Settings | None = None
    try:
        settings = with_env_modules(load_settings(), getattr(args, "env_modules", None))
        if args.command == "policy":
            return cmd_policy_serve(args, settings)
        return asyncio.run(COMMANDS[args.command](args, settings))
    except RolloutError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return EXIT_ERROR
    except RPCError as err:
        print(f"error: {explain_rpc_error(err, settings)}", file=sys.stderr)
        return EXIT_ERROR
    except ValidationError as err:  # a batch input the models refuse (the CLI checks most before)
        first = err.errors()[0]
        print(f"error: {'.'.join(map(str, first['loc']))}: {first['msg']}", file=sys.stderr)
        return EXIT_ERROR
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
