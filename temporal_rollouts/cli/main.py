"""`rollouts`: start batches, watch them, inspect slots, serve the demo policy.

Everything here can also be done with the `temporal` CLI or the Temporal UI: a batch
is a `BatchWorkflow` on task queue `rollouts` started with plain JSON input. The parser,
the batch and server commands live here; progress.py (the progress display, status),
resume.py, inspect.py (show, export, list, cancel), train.py and fork.py hold the rest,
and parsers.py the flags of theirs. The work is the control layer's (temporal_rollouts/client/);
a command gives it flags and words what comes back. Each command imports what it uses when
it runs, so that `rollouts --help` and a usage error answer at once (bench/cli_help.py).
`rollouts view`, `rollouts policy serve` and `rollouts train serve` run programs of their own in this one's place.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, NoReturn

from temporal_rollouts.cli import parsers
from temporal_rollouts.core import defaults  # plain values, importing nothing
from temporal_rollouts.runtime.exit_codes import (  # noqa: F401  (re-exported: the exit codes are the CLI's)
    EXIT_ERROR,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_PIPE_CLOSED,
    EXIT_USAGE,
    batch_exit_code,
    exit_flushed,
    status_exit_code,
)
from temporal_rollouts.cli.help_format import DefaultsHelpFormatter

if TYPE_CHECKING:  # the commands import what they use when they run: `rollouts --help` imports none of it
    from rich.console import Console
    from temporalio.client import Client

    from temporal_rollouts.core.records import BatchInput
    from temporal_rollouts.core.settings import Settings

DEMO_ENV = "terminal_tasks"


def _batch_input(args: argparse.Namespace, settings: Settings) -> BatchInput:
    from temporal_rollouts.cli.envs import note_unknown_env
    from temporal_rollouts.client.batches import batch_input

    env, env_config, task_count = parsers.env_and_config(args)
    known = note_unknown_env(env, settings)  # unknown here: the worker checks it in the first step
    fields = {
        "env": env,
        "num_items": args.items or task_count or defaults.BATCH_ITEMS,
        "group_size": args.group_size,
        "item_offset": args.offset,
        "cycle_items": args.cycle,
        "policy": args.policy,
        "limits": {"max_turns": args.max_turns} if args.max_turns else {},
        "max_concurrency": args.max_concurrency,
        "start_rate": args.start_rate,
        "output": args.output,
        "env_config": env_config,
    }
    if args.harness:
        fields["harness"] = (
            parsers.json_flag("--harness", args.harness) if args.harness.startswith("{") else args.harness
        )
    return batch_input(fields, settings, env_known=known)


async def _warn_without_worker(client: Client, settings: Settings, console: Console) -> None:
    from temporal_rollouts.client.batches import worker_is_polling

    if not await worker_is_polling(client, settings):
        console.print(
            f"[yellow]no worker polls task queue {settings.temporal.task_queue!r}: "
            "start one with `python worker.py`[/yellow]"
        )


async def cmd_batch(args: argparse.Namespace, settings: Settings) -> int:
    import asyncio

    from rich.console import Console

    from temporal_rollouts.cli.progress import finish
    from temporal_rollouts.client.batches import start_batch
    from temporal_rollouts.client.connection import command_client
    from temporal_rollouts.core.settings import DEMO_POLICY

    console = Console(stderr=args.json)
    batch = _batch_input(args, settings)  # a bad input is refused before anything is started or connected
    client = await command_client(settings)
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
    from temporal_rollouts.cli.progress import format_status
    from temporal_rollouts.cli.screen import screen_width
    from temporal_rollouts.cli.train import format_feed
    from temporal_rollouts.client.batches import batch_status
    from temporal_rollouts.client.connection import command_client
    from temporal_rollouts.client.records import describe_or_none
    from temporal_rollouts.client.training import FEED, feed_status

    client = await command_client(settings, start_embedded=False)
    described = await describe_or_none(client, args.batch_id)
    if described is not None and described.workflow_type == FEED:  # a training run: its own figures
        status = await feed_status(client, args.batch_id)
        print(status.model_dump_json() if args.json else format_feed(status, screen_width()))
        return 0
    data = await batch_status(client, args.batch_id)
    print(json.dumps(data) if args.json else format_status(data, screen_width()))
    return status_exit_code(data)


def demo_batch(args: argparse.Namespace, settings: Settings) -> BatchInput:
    """The demo's batch, its policy decided here as `rollouts batch` decides it, so it is labelled."""
    from temporal_rollouts.client.batches import check_items, resolve_policy
    from temporal_rollouts.core.records import BatchInput

    batch = BatchInput(
        env=DEMO_ENV, num_items=args.items, group_size=args.group_size, policy=resolve_policy(settings, None)
    )
    check_items(batch)
    return batch


async def cmd_demo(args: argparse.Namespace, settings: Settings) -> int:
    """The main job on the embedded default: a worker in this process, a demo batch, a summary. A demo
    that fails stops what it started (its server, sandbox, demo policy) and leaves what it found running."""
    import logging

    from rich.console import Console

    from temporal_rollouts.cli.progress import finish
    from temporal_rollouts.client.batches import start_batch
    from temporal_rollouts.runtime.logs import configure_logging
    from temporal_rollouts.runtime.preflight import check_local_sandboxes
    from temporal_rollouts.runtime.started_here import StartedHere
    from temporal_rollouts.runtime.worker import running_worker

    check_local_sandboxes(settings)  # one line naming the fix, before anything is printed or started
    console = Console()
    console.print(
        "[bold]temporal-rollouts demo[/bold]: terminal tasks played by the demo policy "
        "(a scripted test policy that replays reference solutions, not a model)"
    )
    batch = demo_batch(args, settings)  # refused before a worker or server is started
    configure_logging(settings.data_dir, console_level=logging.WARNING)  # the bar owns the screen; details: the log
    before = await StartedHere.note(settings)
    try:
        async with running_worker(settings) as client:
            handle = await start_batch(client, settings, batch)
            code = await finish(client, handle, console, settings, as_json=False, policy=batch.policy)
    except BaseException:
        if stopped := await before.stop_the_rest():
            console.print(f"the demo did not finish; stopped what it had started: {', '.join(stopped)}")
        raise
    if settings.embedded:
        console.print(
            "The Temporal server, sandbox and demo policy keep running for the UI and later batches; "
            "`rollouts server stop` stops them."
        )
    return code


def short_image_name(name: str | None) -> str:
    """An image as a table shows it: `repository:<first 12 of the key>`, or `(own root)`."""
    if name is None:
        return "(own root)"
    repository, colon, tag = name.rpartition(":")
    return f"{repository.rpartition('/')[2]}:{tag[:12]}" if colon and "/" not in tag else name


async def cmd_slots(args: argparse.Namespace, settings: Settings) -> int:
    import time

    from rich.console import Console
    from rich.table import Table

    from temporal_rollouts.client.slots import describe_sandboxes

    containers = await describe_sandboxes(settings)
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
    table = Table("container", "image", "slot", "state", "holder", "expires in (s)")
    for container in containers:
        for slot in container.slots:
            lease = slot.lease
            state = "leased" if lease else f"quarantined: {slot.quarantined}" if slot.quarantined else "free"
            table.add_row(
                container.container_id,
                short_image_name(container.image),
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
    from rich.console import Console

    from temporal_rollouts.client.connection import command_client
    from temporal_rollouts.client.slots import reap_now

    console = Console(stderr=args.json)
    client = await command_client(settings)
    await _warn_without_worker(client, settings, console)
    report = await reap_now(client, settings)
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
    from temporal_rollouts.runtime.logs import configure_logging
    from temporal_rollouts.runtime.preflight import check_local_sandboxes
    from temporal_rollouts.runtime.worker import main_async

    check_local_sandboxes(settings)  # as `python worker.py`: one line, and nothing made, not even the log
    configure_logging(settings.data_dir, verbose=args.verbose)
    await main_async(settings, verbose=args.verbose)
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
    """The demo policy's own program in this process's place (it is a peer of the CLI, never imported)."""
    modules = [arg for module in settings.env_modules for arg in ("--env-module", module)]
    port = str(args.port or settings.demo_policy.port)
    exec_module("temporal_rollouts.policy_servers.demo", ["--host", args.host, "--port", port, *modules, *args.rest])


def cmd_view(args: argparse.Namespace) -> int:
    """The web page's own program (`python -m temporal_rollouts.view`) in this process's place, with the
    flags as given: it parses them, so `rollouts view --help` is its help."""
    exec_module("temporal_rollouts.view", args.rest)


def exec_module(module: str, argv: list[str]) -> NoReturn:
    """Replace this process with `python -m module argv...`: same pid, same terminal, so Ctrl-C and a
    supervisor's SIGTERM reach the server itself."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, "-m", module, *argv])


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollouts",
        description=__doc__.splitlines()[0],
        epilog=f"exit codes: {EXIT_OK} all rollouts scored, {EXIT_ERROR} the command failed, {EXIT_USAGE} usage error, "
        f"{EXIT_PARTIAL} some rollouts failed, {EXIT_FAILED} the batch failed",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    demo = sub.add_parser(
        "demo", help="run a demo batch on the embedded default, start to finish", formatter_class=DefaultsHelpFormatter
    )
    demo.add_argument("--items", type=positive_int, default=12, help="terminal tasks to run")
    demo.add_argument("--group-size", type=positive_int, default=defaults.BATCH_GROUP_SIZE, help="rollouts per task")
    parsers.add_env_module_flag(demo)

    batch = sub.add_parser(
        "batch",
        help="start a batch of rollouts",
        formatter_class=DefaultsHelpFormatter,
        description="Start a batch of rollouts.",
    )
    parsers.add_env_flags(batch)
    batch.add_argument(
        "--items",
        type=positive_int,
        default=None,
        help=f"items of the env's task set (default {defaults.BATCH_ITEMS}; with --tasks, every task of the folder)",
    )
    batch.add_argument(
        "--group-size",
        type=positive_int,
        default=defaults.BATCH_GROUP_SIZE,
        help="rollouts per item (one scored group per item)",
    )
    batch.add_argument(
        "--offset", type=non_negative_int, default=defaults.BATCH_ITEM_OFFSET, help="index of the first item"
    )
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
    batch.add_argument(
        "--max-turns", type=positive_int, default=None, help=f"model turns per rollout (default {defaults.MAX_TURNS})"
    )
    batch.add_argument(
        "--max-concurrency", type=positive_int, default=defaults.BATCH_MAX_CONCURRENCY, help="rollouts running at once"
    )
    batch.add_argument(
        "--start-rate",
        type=float,
        default=defaults.BATCH_START_RATE,
        help="rollouts started per second at most; 0 starts them as fast as the batch can",
    )
    batch.add_argument(
        "--harness",
        default=None,
        help="run this agent harness in each slot instead of our loop: minimal, mini-swe-agent, "
        "or a JSON spec (docs/harnesses.md)",
    )
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

    worker = sub.add_parser("worker", help="run a worker (same as `python worker.py`)")
    worker.add_argument("--verbose", action="store_true", help="full tracebacks on the console too")
    parsers.add_env_module_flag(worker)

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

    parsers.add_inspect_parsers(sub)
    parsers.add_train_parser(sub)
    parsers.add_fork_parser(sub)
    parsers.add_versions_parser(sub)
    parsers.add_envs_parser(sub)
    parsers.add_images_parser(sub)
    return parser


COMMANDS = {
    "batch": cmd_batch,
    "status": cmd_status,
    "demo": cmd_demo,
    "slots": cmd_slots,
    "reap": cmd_reap,
    "resume": "temporal_rollouts.cli.resume:cmd_resume",
    "worker": cmd_worker,
    "server": cmd_server,
    "train": "temporal_rollouts.cli.train:cmd_train",
    "fork": "temporal_rollouts.cli.fork:cmd_fork",
    "envs": "temporal_rollouts.cli.envs:cmd_envs",
    "versions": "temporal_rollouts.cli.versions:cmd_versions",
    "images": "temporal_rollouts.cli.images:cmd_images",
    **{name: f"temporal_rollouts.cli.inspect:cmd_{name}" for name in ("show", "export", "list", "cancel")},
}
"""Each command's function, or where to import it from when it runs."""


def command(name: str):
    found = COMMANDS[name]
    if isinstance(found, str):
        import importlib

        module, _, function = found.partition(":")
        found = getattr(importlib.import_module(module), function)
    return found


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown and args.command == "policy":  # the demo policy's own fault flags (--fail-rate 0.2, ...)
        args.rest = [*unknown, *args.rest]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if args.command == "view":  # the page's program reads the settings itself, and answers --help at once
        return cmd_view(args)
    if args.command == "train" and args.train_command == "serve":  # the door's endpoint, a program of its own
        exec_module("temporal_rollouts.door", args.rest)
    import asyncio

    from temporal_rollouts.runtime.command_errors import report_error
    from temporal_rollouts.runtime.config import load_settings, with_env_modules

    settings: Settings | None = None
    try:
        settings = with_env_modules(load_settings(), getattr(args, "env_modules", None))
        if args.command == "policy":
            return cmd_policy_serve(args, settings)
        return asyncio.run(command(args.command)(args, settings))
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        return report_error(err, settings)


def run() -> None:
    """The `rollouts` command (runtime/exit_codes.py says why it leaves with os._exit)."""
    exit_flushed(lambda: main())


if __name__ == "__main__":
    run()
