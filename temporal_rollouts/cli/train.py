"""`rollouts train`: start, watch and stop training runs (TrainingFeedWorkflow, one per run name).

    rollouts train start NAME --env ENV --policy P [--group-size G] [--batch-size B] [--max-staleness S] ...
    rollouts train serve [--port 8780]      # the trainer door's endpoint (temporal_rollouts/door/)
    rollouts train status NAME [--json] [--watch]
    rollouts train stop NAME [--now]
    rollouts train list

A run lives in Temporal, not in this command: `start` returns once it runs, a run whose name is
already running is refused (attach with `status`), and `stop` drains it (no new groups; those in
flight finish and are posted) unless `--now` cancels them. The Atropos env's `serve` starts or
attaches to the same workflow.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from datetime import datetime
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from temporal_rollouts.cli.envs import add_env_module_flag, env_is_known
from temporal_rollouts.cli.help_format import DefaultsHelpFormatter
from temporal_rollouts.cli.progress import root_cause
from temporal_rollouts.cli.records import QUERY_TIMEOUT, require_workflow, status_name
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.feed import FeedInput, FeedStatus, StaleGroups
from temporal_rollouts.core.inputs import parse_input
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.door import server as door_server
from temporal_rollouts.runtime.temporal import connect

FEED = "TrainingFeedWorkflow"
WATCH_EVERY_S = 2.0


def add_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="training runs a trainer pulls batches from: start, serve, status, stop, list")
    actions = train.add_subparsers(dest="train_command", required=True)
    start = actions.add_parser("start", help="start a training run", formatter_class=DefaultsHelpFormatter)
    start.add_argument("name", help="the run's name (its workflow id)")
    start.add_argument("--env", required=True, help="registered env")
    start.add_argument("--policy", default=None, help="a token-level policy, or a chat policy with a tokenizer")
    start.add_argument(
        "--tokenizer",
        default=None,
        help="for a chat policy that names none: a tokenizer (name or folder on the workers) for template tokens",
    )
    start.add_argument("--group-size", type=int, default=8)
    start.add_argument(
        "--batch-size", type=int, default=0, help="sequences per trainer batch (door); 0: the trainer registers it"
    )
    start.add_argument("--max-staleness", type=int, default=1, help="trainer steps a posted token may lag")
    start.add_argument(
        "--stale-groups",
        choices=[s.value for s in StaleGroups],
        default=StaleGroups.POST.value,
        help="what happens to a group that ends staler anyway",
    )
    start.add_argument("--in-flight", type=int, default=16, help="groups whose rollouts run at once")
    start.add_argument(
        "--max-groups", type=int, default=0, help="stop after posting this many groups; 0: until stopped"
    )
    start.add_argument("--max-retries", type=int, default=3, help="runs a rollout gets after a machinery failure")
    start.add_argument("--max-turns", type=int, default=None)
    start.add_argument("--temperature", type=float, default=None)
    start.add_argument("--max-tokens", type=int, default=None, help="per-turn generation cap")
    start.add_argument("--env-config", default=None, help="JSON object passed to the env")
    start.add_argument("--api-url", default=None, help="run-api; default: the config's atropos.api_url")
    start.add_argument(
        "--sink",
        choices=["door", "atropos", "jsonl"],
        default="door",
        help="door: a trainer takes batches (rollouts train serve); atropos: post to run-api; jsonl: a file",
    )
    start.add_argument("--output", default=None, help="JSONL file in the results folder (--sink jsonl)")
    start.add_argument("--json", action="store_true")
    add_env_module_flag(start)
    serve = actions.add_parser(
        "serve",
        help="the trainer door: trainers take and acknowledge runs' batches over HTTP",
        formatter_class=DefaultsHelpFormatter,
    )
    door_server.add_arguments(serve)
    status = actions.add_parser("status", help="a run's figures: in flight, posted, stale, retried, dropped")
    status.add_argument("name")
    status.add_argument("--json", action="store_true")
    status.add_argument("--watch", action="store_true", help="refresh until the run ends (Ctrl-C leaves it running)")
    stop = actions.add_parser("stop", help="stop a run: no new groups; the ones in flight finish and are posted")
    stop.add_argument("name")
    stop.add_argument("--now", action="store_true", help="cancel the rollouts in flight instead")
    actions.add_parser("list", help="training runs, newest first")


def feed_input(args: argparse.Namespace) -> FeedInput:
    fields: dict[str, Any] = {
        "env": args.env,
        "policy": args.policy,
        "tokenizer": args.tokenizer,
        "group_size": args.group_size,
        "batch_size": args.batch_size,
        "max_staleness": args.max_staleness,
        "stale_groups": args.stale_groups,
        "max_groups_in_flight": args.in_flight,
        "max_groups": args.max_groups,
        "max_retries": args.max_retries,
        "api_url": args.api_url,
        "sink": args.sink,
        "output": args.output,
    }
    if args.env_config:
        try:
            fields["env_config"] = json.loads(args.env_config)
        except json.JSONDecodeError as err:
            raise ConfigError(f"--env-config: not valid JSON ({err})") from None
    if args.max_turns:
        fields["limits"] = {"max_turns": args.max_turns}
    sampling = {k: v for k, v in (("temperature", args.temperature), ("max_tokens", args.max_tokens)) if v is not None}
    if sampling:
        fields["sampling"] = sampling
    return parse_input(FeedInput, fields, FEED)


def check_start(feed: FeedInput, settings: Settings) -> None:
    """What the run's own first step checks, checked here too so a mistake is one line, not a failed run
    (an env unknown here only gets a notice: a worker may know it, and the run's first step checks it)."""
    env_is_known(feed.env, settings)
    endpoint = settings.policy_endpoint(feed.policy)
    if isinstance(endpoint, ChatPolicy) and not (endpoint.tokenizer or feed.tokenizer):
        name = feed.policy or settings.default_policy
        raise ConfigError(
            f"policy {name!r} gives no token ids: a training run needs a token-level policy (sglang, vllm) "
            f"or a chat policy with a tokenizer (policies.{name}.tokenizer, or --tokenizer)"
        )


async def start_feed(client: Client, settings: Settings, name: str, feed: FeedInput) -> WorkflowHandle:
    """Start the run `name`; a ConfigError when one of that name is already running."""
    from workflows.feed import TrainingFeedWorkflow

    try:
        return await client.start_workflow(
            TrainingFeedWorkflow.run,
            feed,
            id=name,
            task_queue=settings.temporal.task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(sa.ENV, feed.env)]),
        )
    except WorkflowAlreadyStartedError:
        raise ConfigError(
            f"a training run named {name!r} is running: watch it with `rollouts train status {name}`, "
            f"or stop it with `rollouts train stop {name}`"
        ) from None


async def feed_status(client: Client, name: str) -> FeedStatus:
    """The run's figures; a run that failed, or was terminated, is an error naming why."""
    described = await require_workflow(client, name, FEED)
    handle = client.get_workflow_handle(name)
    if described.status not in (WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.COMPLETED):
        state = described.status.name.lower() if described.status else "gone"
        try:
            await handle.result()
        except WorkflowFailureError as err:
            raise ConfigError(f"training run {name} {state}: {root_cause(err)}") from None
        raise ConfigError(f"training run {name} {state}")
    return FeedStatus.model_validate(await handle.query("status", rpc_timeout=QUERY_TIMEOUT))


def format_feed(status: FeedStatus) -> str:
    f, t = status.figures, status.trainer
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(f.dropped.items())) or "none"
    stale = ", ".join(f"{k}: {v}" for k, v in sorted(f.staleness.items(), key=lambda kv: int(kv[0]))) or "-"
    served = f", weights v{t.policy_version} served" if t.policy_version is not None else ""
    waiting_for = "acknowledge" if status.door is not None else "step"
    admission = (
        "open"
        if status.admitted
        else f"held (waiting for the trainer to {waiting_for})"
        if status.in_flight or t.registered or status.door is not None
        else "-"
    )
    if status.door is not None:  # the run serves its batches itself: staleness is decided at consumption
        groups = f"{status.in_flight} in flight, {f.groups_posted} stored for the door"
        tokens = f"{f.tokens_generated} generated, {f.tokens_posted} stored"
        trainer = door_line(status)
    else:
        groups = (
            f"{status.in_flight} in flight ({status.held} finished, waiting for room in run-api), {f.groups_posted} "
            f"posted, {f.groups_stale} posted stale"
        )
        tokens = (
            f"{f.tokens_generated} generated, {f.tokens_posted} posted; staleness at posting (steps: groups): {stale}"
        )
        trainer = (
            f"step {t.current_step}{served}, batch {t.batch_size}, {t.queued} of ours queued, env id {t.env_id}"
            if t.registered
            else "no trainer registered yet"
        )
    lines = [
        f"training run {status.run} ({status.env}): {status.phase}" + (" - stopping" if status.stopping else ""),
        f"  groups: {f.groups_started} started, {groups}, dropped: {dropped}",
        f"  rollouts: {f.rollouts_started} started, {status.rollouts_running} running, {f.rollouts_finished} finished, "
        f"{f.rollouts_retried} resumed after a machinery failure",
        f"  tokens: {tokens}",
        f"  trainer: {trainer}; admission {admission} (max staleness {status.max_staleness})",
    ]
    if status.output:
        lines.append(f"  groups written to {status.output}")
    return "\n".join(lines)


def door_line(status: FeedStatus) -> str:
    """The door's figures on one line: what the trainer took, acknowledged and was handed again."""
    door = status.door
    assert door is not None
    d = door.figures
    size = f"batches of {door.batch_size}" if door.batch_size else "no trainer registered yet (batch size unknown)"
    stale = ", ".join(f"{k}: {v}" for k, v in sorted(d.staleness.items(), key=lambda kv: int(kv[0]))) or "-"
    return (
        f"door at version {door.trainer_version}, {size}; batches {d.batches_formed} formed, {d.batches_taken} taken, "
        f"{d.batches_acknowledged} acknowledged, {d.batches_redelivered} re-delivered ({d.leases_expired} leases "
        f"expired), {door.batches_out} out; {door.pending_groups} groups waiting; stale groups {d.groups_marked_stale} "
        f"marked, {d.groups_requeued} re-queued, {d.groups_dropped_stale} dropped; staleness at consumption {stale}"
    )


async def cmd_train(args: argparse.Namespace, settings: Settings) -> int:
    if args.train_command == "serve":
        return await door_server.serve(args, settings)
    if args.train_command == "start":
        check_start(feed_input(args), settings)  # a run that could never post is refused before anything starts
    client = await connect(settings, start_embedded=args.train_command == "start")
    console = Console()
    if args.train_command == "start":
        feed = feed_input(args)
        handle = await start_feed(client, settings, args.name, feed)
        if args.json:
            print(json.dumps({"run": handle.id, "status": "running"}))
        else:
            console.print(
                f"started training run {handle.id}; watch it with `rollouts train status {handle.id} --watch`"
            )
        return 0
    if args.train_command == "list":
        return await _list(client, console)
    if args.train_command == "stop":
        described = await require_workflow(client, args.name, FEED)
        if described.status != WorkflowExecutionStatus.RUNNING:
            state = described.status.name.lower() if described.status else "gone"
            raise ConfigError(f"training run {args.name} is not running (it is {state})")
        await client.get_workflow_handle(args.name).signal("stop_now" if args.now else "stop")
        console.print(
            f"{'cancelling' if args.now else 'draining'} {args.name}: "
            f"`rollouts train status {args.name}` shows when it is done"
        )
        return 0
    while True:
        status = await feed_status(client, args.name)
        if args.json:
            print(status.model_dump_json())
        else:
            console.print(format_feed(status), soft_wrap=True)
        if not args.watch or status.phase == "done":
            return 0
        await asyncio.sleep(WATCH_EVERY_S)


class RunSummary(BaseModel):
    """One training run in `rollouts train list` and on the web page."""

    run: str
    status: str
    env: str | None = None
    started_at: datetime | None = None
    groups_posted: int | None = None
    in_flight: int | None = None


async def list_training_runs(client: Client, limit: int = 50) -> list[RunSummary]:
    """Training runs, newest first; a running one with its posted and in-flight groups."""
    runs: list[RunSummary] = []
    seen: set[str] = set()
    async for execution in client.list_workflows(f"WorkflowType = '{FEED}'"):
        if execution.id in seen:  # an earlier run of one that continued as new
            continue
        seen.add(execution.id)
        summary = RunSummary(
            run=execution.id,
            status=status_name(execution.status),
            env=execution.typed_search_attributes.get(sa.ENV),
            started_at=execution.start_time,
        )
        if execution.status == WorkflowExecutionStatus.RUNNING:
            try:
                status = FeedStatus.model_validate(
                    await client.get_workflow_handle(execution.id).query("status", rpc_timeout=QUERY_TIMEOUT)
                )
                summary.groups_posted, summary.in_flight = status.figures.groups_posted, status.in_flight
            except RPCError:
                pass
        runs.append(summary)
        if len(runs) >= limit:
            break
    return runs


async def _list(client: Client, console: Console) -> int:
    runs = await list_training_runs(client, limit=200)
    for run in runs:
        started = run.started_at.isoformat(timespec="seconds") if run.started_at else "-"
        line = f"{run.run}  {run.status}  started {started}"
        if run.groups_posted is not None:
            line += f"  posted {run.groups_posted}, in flight {run.in_flight}"
        console.print(line, soft_wrap=True)
    if not runs:
        console.print("no training runs (start one with `rollouts train start NAME --env ENV --policy P`)")
    return 0
