"""`rollouts train`: start, watch and stop training runs (TrainingFeedWorkflow, one per run name).

    rollouts train start NAME --env ENV --policy P [--group-size G] [--max-staleness S] ...
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

from pydantic import BaseModel, Field
from rich.console import Console
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from temporal_rollouts.cli.envs import env_is_known
from temporal_rollouts.cli.progress import root_cause
from temporal_rollouts.cli.records import (
    QUERY_TIMEOUT,
    RETRIES_SAMPLED,
    describe_or_none,
    pending_notes,
    require_workflow,
    retry_summary,
    status_name,
    waiting_on_retries,
)
from temporal_rollouts.cli.screen import Column, labelled, screen_width, table_lines, when
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.feed import FeedInput, FeedStatus
from temporal_rollouts.core.inputs import parse_input
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.cli.connection import command_client

FEED = "TrainingFeedWorkflow"
WATCH_EVERY_S = 2.0


def feed_input(args: argparse.Namespace) -> FeedInput:
    fields: dict[str, Any] = {
        "env": args.env,
        "policy": args.policy,
        "tokenizer": args.tokenizer,
        "group_size": args.group_size,
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


class RunReport(FeedStatus):
    """`rollouts train status`: the run's figures, what became of it, and what fails while it runs."""

    outcome: str = Field(description="running, completed, or stopped (ended by `rollouts train stop`).")
    retrying: list[str] = Field(
        default_factory=list,
        description="While it runs: the steps that failed and wait for a retry (its rollouts' and its own), "
        "one line per cause, with the last error and the attempt.",
    )


def run_outcome(status: str, final: FeedStatus | None) -> str:
    """What became of a run, one definition for `train status`, `train list` and the web page: a run
    that ended because it was told to stop (`train stop`, `--now` or not) is `stopped`, never `completed`."""
    if status == "completed" and final is not None and final.stopping:
        return "stopped"
    return status


async def run_retries(client: Client, name: str, description: Any, sample: int = 50) -> list[str]:
    """One line per cause of the retries of a running run: its own steps (registering with run-api,
    posting) and its rollouts' (a model that cannot be reached, a template that cannot render)."""
    own = [f"the run's {note.activity}: {note.headline}" for note in pending_notes(name, description)]
    return own + retry_summary(await waiting_on_retries(client, name, sample))


async def feed_status(client: Client, name: str) -> RunReport:
    """The run's figures; a run that failed, or was terminated, is an error naming why. A finished run's
    come from its result (no worker needs to answer); a running one's from its `status` query."""
    described = await require_workflow(client, name, FEED)
    handle = client.get_workflow_handle(name)
    if described.status == WorkflowExecutionStatus.COMPLETED:
        final = FeedStatus.model_validate(await handle.result())
        return RunReport(**dict(final), outcome=run_outcome("completed", final))
    if described.status != WorkflowExecutionStatus.RUNNING:
        state = described.status.name.lower() if described.status else "gone"
        try:
            await handle.result()
        except WorkflowFailureError as err:
            raise ConfigError(f"training run {name} {state}: {root_cause(err)}") from None
        raise ConfigError(f"training run {name} {state}")
    status = FeedStatus.model_validate(await handle.query("status", rpc_timeout=QUERY_TIMEOUT))
    retrying = await run_retries(client, name, described.raw_description)
    return RunReport(**dict(status), outcome="running", retrying=retrying)


def format_feed(status: RunReport, width: int | None = None) -> str:
    """The run's figures for people: a label and its values a line, the values wrapped under
    themselves when the screen (`width`) is narrower than they are long."""
    f, t = status.figures, status.trainer
    dropped = ", ".join(f"{k} {v}" for k, v in sorted(f.dropped.items())) or "none"
    stale = ", ".join(f"{k}: {v}" for k, v in sorted(f.staleness.items(), key=lambda kv: int(kv[0]))) or "-"
    served = f", weights v{t.policy_version} served" if t.policy_version is not None else ""
    trainer = (
        f"step {t.current_step}{served}, batch {t.batch_size}, {t.queued} of ours queued, env id {t.env_id}"
        if t.registered
        else "no trainer registered yet"
    )
    admission = (
        "open"
        if status.admitted
        else "held (waiting for the trainer to step)"
        if status.in_flight or t.registered
        else "-"
    )
    state = status.outcome
    if state == "running":
        state = f"running ({status.phase}" + (", stopping)" if status.stopping else ")")
    fields = [
        (
            "groups",
            f"{f.groups_started} started, {status.in_flight} in flight ({status.held} finished, waiting for room "
            f"in run-api), {f.groups_posted} posted, {f.groups_stale} posted stale, dropped: {dropped}",
        ),
        (
            "rollouts",
            f"{f.rollouts_started} started, {status.rollouts_running} running, {f.rollouts_finished} finished, "
            f"{f.rollouts_retried} resumed after a machinery failure",
        ),
        ("tokens", f"{f.tokens_generated} generated, {f.tokens_posted} posted"),
        ("staleness", f"at posting (trainer steps: groups) {stale}"),
        ("trainer", trainer),
        ("admission", f"{admission}, max staleness {status.max_staleness}"),
        *(("retrying", line) for line in status.retrying),
    ]
    if status.output:
        fields.append(("written to", status.output))
    return "\n".join([f"training run {status.run} ({status.env}): {state}", *labelled(fields, width)])


async def cmd_train(args: argparse.Namespace, settings: Settings) -> int:
    if args.train_command == "start":
        check_start(feed_input(args), settings)  # a run that could never post is refused before anything starts
    client = await command_client(settings, start_embedded=args.train_command == "start")
    console = Console()
    if args.train_command == "start":
        feed = feed_input(args)
        earlier = await describe_or_none(client, args.name)
        handle = await start_feed(client, settings, args.name, feed)
        if args.json:
            print(json.dumps({"run": handle.id, "status": "running"}))
            return 0
        if earlier is not None:  # never silently: the name's earlier run is kept, this is a new one
            console.print(
                f"{args.name} ran before (its last run {status_name(earlier.status)}): this is a new run of it, "
                "with its own figures; the earlier run's stay in its history"
            )
        console.print(f"started training run {handle.id}; watch it with `rollouts train status {handle.id} --watch`")
        return 0
    if args.train_command == "list":
        return await _list(client)
    if args.train_command == "stop":
        described = await require_workflow(client, args.name, FEED)
        if described.status != WorkflowExecutionStatus.RUNNING:
            state = status_name(described.status)
            if described.status == WorkflowExecutionStatus.COMPLETED:  # completed, or stopped before
                state = (await feed_status(client, args.name)).outcome
            raise ConfigError(f"training run {args.name} is not running (it is {state})")
        await client.get_workflow_handle(args.name).signal("stop_now" if args.now else "stop")
        console.print(
            f"{'cancelling' if args.now else 'draining'} {args.name}: "
            f"`rollouts train status {args.name}` shows when it is done"
        )
        return 0
    if args.json or not args.watch:
        status = await feed_status(client, args.name)
        print(status.model_dump_json() if args.json else format_feed(status, screen_width()))
        return 0
    await watch_run(client, args.name, console)
    return 0


async def watch_run(client: Client, name: str, console: Console) -> None:
    """`train status --watch`: the figures redrawn in place every WATCH_EVERY_S until the run ends (on a
    terminal; into a pipe, each refresh is a block of its own, as it cannot be redrawn)."""
    from rich.live import Live
    from rich.text import Text

    if not console.is_terminal:
        while (status := await feed_status(client, name)).outcome == "running":
            print(format_feed(status), "", sep="\n", flush=True)
            await asyncio.sleep(WATCH_EVERY_S)
        print(format_feed(status))
        return
    with Live(console=console, auto_refresh=False, transient=False) as live:
        while True:
            status = await feed_status(client, name)
            live.update(Text(format_feed(status, console.width)), refresh=True)
            if status.outcome != "running":
                return
            await asyncio.sleep(WATCH_EVERY_S)


class RunSummary(BaseModel):
    """One training run in `rollouts train list` and on the web page."""

    run: str
    status: str
    outcome: str = Field(description="running, completed, stopped (by `rollouts train stop`), failed, ...")
    env: str | None = None
    started_at: datetime | None = None
    groups_posted: int | None = None
    in_flight: int | None = None
    retrying: list[str] = Field(default_factory=list, description="While it runs: what fails and waits for a retry.")


async def list_training_runs(
    client: Client, limit: int = 50, finals: dict[str, FeedStatus | None] | None = None
) -> list[RunSummary]:
    """Training runs, newest first; a running one with its posted and in-flight groups and what it retries,
    a finished one with what it posted and how it ended. `finals` keeps finished runs' results (by run id)."""
    finals = {} if finals is None else finals
    runs: list[RunSummary] = []
    seen: set[str] = set()
    async for execution in client.list_workflows(f"WorkflowType = '{FEED}'"):
        if execution.id in seen:  # an earlier run of one that continued as new
            continue
        seen.add(execution.id)
        status = status_name(execution.status)
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        figures: FeedStatus | None = None
        retrying: list[str] = []
        try:
            if execution.status == WorkflowExecutionStatus.RUNNING:
                figures = FeedStatus.model_validate(await handle.query("status", rpc_timeout=QUERY_TIMEOUT))
                described = await handle.describe()
                retrying = await run_retries(client, execution.id, described.raw_description, RETRIES_SAMPLED)
            elif execution.status == WorkflowExecutionStatus.COMPLETED:
                if execution.run_id not in finals:
                    finals[execution.run_id] = FeedStatus.model_validate(await handle.result(follow_runs=False))
                figures = finals[execution.run_id]
        except RPCError:
            pass
        runs.append(
            RunSummary(
                run=execution.id,
                status=status,
                outcome=run_outcome(status, figures),
                env=execution.typed_search_attributes.get(sa.ENV),
                started_at=execution.start_time,
                groups_posted=figures.figures.groups_posted if figures else None,
                in_flight=figures.in_flight
                if figures and execution.status == WorkflowExecutionStatus.RUNNING
                else None,
                retrying=retrying,
            )
        )
        if len(runs) >= limit:
            break
    return runs


RUN_COLUMNS = [
    Column("run"),
    Column("status"),
    Column("posted", right=True),
    Column("in flight", right=True),
    Column("started"),
    Column("env", optional=True),
]


async def _list(client: Client) -> int:
    runs = await list_training_runs(client, limit=200)
    if not runs:
        print("no training runs (start one with `rollouts train start NAME --env ENV --policy P`)")
        return 0
    rows = [
        (
            run.run,
            run.outcome,
            "-" if run.groups_posted is None else str(run.groups_posted),
            "-" if run.in_flight is None else str(run.in_flight),
            when(run.started_at),
            run.env or "-",
        )
        for run in runs
    ]
    print("\n".join(table_lines(RUN_COLUMNS, rows, screen_width(), [[f"  ! {n}" for n in r.retrying] for r in runs])))
    return 0
