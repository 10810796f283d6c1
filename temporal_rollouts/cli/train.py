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
from typing import Any

from rich.console import Console
from temporalio.client import Client

from temporal_rollouts.cli.envs import note_unknown_env
from temporal_rollouts.cli.parsers import env_and_config
from temporal_rollouts.cli.screen import Column, labelled, screen_width, table_lines, when
from temporal_rollouts.client.connection import command_client
from temporal_rollouts.client.records import describe_or_none, status_name
from temporal_rollouts.client.training import (
    FEED,
    RunReport,
    check_start,
    feed_status,
    list_training_runs,
    start_feed,
    stop_run,
)
from temporal_rollouts.core.feed import FeedInput
from temporal_rollouts.core.inputs import parse_input
from temporal_rollouts.core.settings import Settings

WATCH_EVERY_S = 2.0


def feed_input(args: argparse.Namespace) -> FeedInput:
    env, env_config, _ = env_and_config(args)
    fields: dict[str, Any] = {
        "env": env,
        "env_config": env_config,
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
    if args.max_turns:
        fields["limits"] = {"max_turns": args.max_turns}
    sampling = {k: v for k, v in (("temperature", args.temperature), ("max_tokens", args.max_tokens)) if v is not None}
    if sampling:
        fields["sampling"] = sampling
    return parse_input(FeedInput, fields, FEED)


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
    rollouts = (
        f"{f.rollouts_started} started, {status.rollouts_running} running, {f.rollouts_finished} finished, "
        f"{f.rollouts_retried} resumed after a machinery failure"
    )
    if status.door is not None:  # the run serves its batches itself: staleness is decided at consumption
        fields = door_fields(status, dropped, rollouts)
    else:
        fields = [
            (
                "groups",
                f"{f.groups_started} started, {status.in_flight} in flight ({status.held} finished, waiting for room "
                f"in run-api), {f.groups_posted} posted, {f.groups_stale} posted stale, dropped: {dropped}",
            ),
            ("rollouts", rollouts),
            ("tokens", f"{f.tokens_generated} generated, {f.tokens_posted} posted"),
            ("staleness", f"at posting (trainer steps: groups) {stale}"),
            ("trainer", trainer),
            ("admission", f"{admission}, max staleness {status.max_staleness}"),
        ]
    fields += [("retrying", line) for line in status.retrying]
    if status.output:
        fields.append(("written to", status.output))
    return "\n".join([f"training run {status.run} ({status.env}): {state}", *labelled(fields, width)])


def door_fields(status: RunReport, dropped: str, rollouts: str) -> list[tuple[str, str]]:
    """A door run's figures: what the trainer took, acknowledged and was handed again, and the staleness at
    consumption."""
    f, door = status.figures, status.door
    assert door is not None
    d = door.figures
    consumed = ", ".join(f"{k}: {v}" for k, v in sorted(d.staleness.items(), key=lambda kv: int(kv[0]))) or "-"
    size = f"batches of {door.batch_size}" if door.batch_size else "no trainer registered yet (no batch size)"
    admission = (
        "open" if status.admitted else "held (waiting for the trainer to acknowledge)" if door.batch_size else "-"
    )
    return [
        (
            "groups",
            f"{f.groups_started} started, {status.in_flight} in flight, {f.groups_posted} stored for the door, "
            f"dropped: {dropped}",
        ),
        ("rollouts", rollouts),
        ("tokens", f"{f.tokens_generated} generated, {f.tokens_posted} stored, {d.tokens_acknowledged} acknowledged"),
        ("trainer", f"version {door.trainer_version}, {size}"),
        (
            "door",
            f"batches {d.batches_formed} formed, {d.batches_taken} taken, {d.batches_acknowledged} acknowledged, "
            f"{d.batches_redelivered} re-delivered ({d.leases_expired} leases expired), {door.batches_out} out; "
            f"{door.pending_groups} groups waiting",
        ),
        (
            "stale groups",
            f"{d.groups_marked_stale} marked, {d.groups_requeued} re-queued, {d.groups_dropped_stale} dropped",
        ),
        ("staleness", f"at consumption (versions: groups) {consumed}"),
        ("admission", f"{admission}, max staleness {status.max_staleness}"),
    ]


async def cmd_train(args: argparse.Namespace, settings: Settings) -> int:
    if args.train_command == "start":
        feed = feed_input(args)
        note_unknown_env(feed.env, settings)  # a notice only: a worker may know it, and the run's first step checks it
        check_start(feed, settings)  # a run that could never post is refused before anything starts
    client = await command_client(settings, start_embedded=args.train_command == "start")
    console = Console()
    if args.train_command == "start":
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
        await stop_run(client, args.name, now=args.now)
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
