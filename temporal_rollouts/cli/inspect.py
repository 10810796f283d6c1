"""`rollouts show`, `export`, `list` and `cancel`: read what agents did, and stop a batch.

Everything here reads through temporal_rollouts/cli/records.py, which joins a
rollout's result in Temporal with its conversation in the object store; these functions
only print. Text output is for people (tool results cut to a readable length); `--json`
and `export` give everything.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.cli.list_rollouts import cmd_list_rollouts, refuse_filters_without_a_batch
from temporal_rollouts.cli.records import (
    BatchSummary,
    RolloutRecord,
    RolloutResult,
    batch_rollout_ids,
    list_batches,
    load_rollout,
    require_workflow,
    rollout_branches,
)
from temporal_rollouts.cli.parsers import BATCHES_LISTED
from temporal_rollouts.cli.screen import Column, screen_width, table_lines, when
from temporal_rollouts.cli.connection import command_client
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.storage.transcripts import TranscriptStore

TOOL_RESULT_CHARS = 800
"""A tool result longer than this is shown as its head and tail in `rollouts show`."""
EXPORT_CONCURRENCY = 16
"""Rollouts `rollouts export` reads at once (each is a describe, a result and a transcript walk)."""


async def inspection_client(settings: Settings) -> tuple[Client, TranscriptStore]:
    """A client that never starts a server (reading must not bring one up) and the transcript store."""
    objects = object_client(settings)
    client = await command_client(settings, objects=objects, start_embedded=False)
    return client, TranscriptStore(objects, settings.storage.bucket)


def cut(text: str, limit: int = TOOL_RESULT_CHARS) -> str:
    if len(text) <= limit:
        return text
    head, tail = text[: limit * 2 // 3], text[-limit // 3 :]
    return f"{head}\n... [{len(text) - len(head) - len(tail)} characters cut; --json has them all] ...\n{tail}"


def _indent(text: str, prefix: str = "    ") -> str:
    return "\n".join(prefix + line for line in text.splitlines()) or prefix


def format_message(message: Message) -> str:
    lines = [f"[{message.role}]" + (f" ({message.name})" if message.name else "")]
    if message.reasoning_content:
        lines += ["  reasoning:", _indent(cut(message.reasoning_content))]
    if message.content:
        lines.append(_indent(cut(message.content) if message.role == "tool" else message.content))
    for call in message.tool_calls or []:
        lines.append(f"  -> {call.function.name}({call.function.arguments})  [{call.id}]")
    return "\n".join(lines)


def format_rollout(record: RolloutRecord) -> str:
    """The conversation, then why it stopped, its score, tool errors and timings."""
    out = [f"rollout {record.rollout_id}  ({record.status}; run {record.run_id})"]
    if record.batch_id:
        out.append(f"batch   {record.batch_id}")
    result = record.result
    out += _tree_lines(record)
    out.append("")
    for message in record.messages:
        out += [format_message(message), ""]
    if record.transcript_error:
        out.append(f"conversation unavailable: {record.transcript_error}")
    if result is None:
        out.append("no result recorded (the run left no state)")
        return "\n".join(out)
    if result.image:
        out.append(f"image        {result.image}")
    if result.stop_reason is None:  # running: it has neither yet
        step = f" ({record.phase})" if record.phase else ""
        out.append(f"stop reason  - (still running{step})")
        out.append("score        - (not scored yet)")
    else:
        out.append(
            f"stop reason  {result.stop_reason.value}" + (f": {result.stop_detail}" if result.stop_detail else "")
        )
        out.append(f"score        {not_scored(result) if result.score is None else f'{result.score:g}'}")
    out.append(f"turns        {result.turns}, tool calls {result.tool_calls}, tool errors {len(result.tool_errors)}")
    for error in result.tool_errors:
        out.append(f"  turn {error.turn} {error.tool_name}({error.arguments}): {error.error}")
    if result.verify_details:
        out.append(f"verifier     {json.dumps(result.verify_details, default=str)}")
    if result.timings:
        out.append("timings (s)  " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items()))
    return "\n".join(out)


def not_scored(result: RolloutResult) -> str:
    """What a closed rollout without a score shows where a score would be: never a 0."""
    return f"- (not scored: the rollout {'failed' if result.failed else 'ended without one'})"


def _tree_lines(record: RolloutRecord) -> list[str]:
    """Where the rollout was forked from, and the rollouts forked or branched from it, by turn."""
    lines = []
    fork = record.result.fork if record.result else None
    if fork is not None:
        how = fork.workspace + (f", {fork.replayed_calls} tool call(s) replayed" if fork.workspace == "replay" else "")
        diverged = f", {len(fork.divergences)} diverged" if fork.divergences else ""
        lines.append(f"forked  from {fork.parent} after turn {fork.at_turn} (workspace: {how}{diverged})")
        lines += [f"        not carried: {item}" for item in fork.not_carried]
    by_turn: dict[int | None, list[str]] = {}
    for link in record.branches:
        by_turn.setdefault(link.at_turn, []).append(f"{link.rollout_id} ({link.status})")
    for turn, links in by_turn.items():
        lines.append(f"branches after turn {turn}: " + ", ".join(links))
    return lines


async def cmd_show(args: argparse.Namespace, settings: Settings) -> int:
    client, transcripts = await inspection_client(settings)
    record = await load_rollout(client, transcripts, args.rollout_id)
    record.branches = await rollout_branches(client, args.rollout_id)
    if args.json:
        print(json.dumps(record.shown()))
    else:
        print(format_rollout(record))
    return 0


async def export_batch(client: Client, transcripts: TranscriptStore, batch_id: str, output: Path) -> dict[str, Any]:
    """Every rollout of a batch, failed ones included, one JSON object a line."""
    await require_workflow(client, batch_id, "BatchWorkflow")
    ids = await batch_rollout_ids(client, batch_id)
    reading = asyncio.Semaphore(EXPORT_CONCURRENCY)

    async def load(rollout: str) -> RolloutRecord:
        async with reading:
            return await load_rollout(client, transcripts, rollout)

    records = await asyncio.gather(*(load(rollout) for rollout in ids))
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.shown()) + "\n")
    statuses: dict[str, int] = {}
    for record in records:
        statuses[record.status] = statuses.get(record.status, 0) + 1
    return {"batch_id": batch_id, "output": str(output), "rollouts": len(records), "statuses": statuses}


def write_atropos_html(records: list[RolloutRecord], output: Path) -> Path:
    """The Atropos viewer's HTML (atroposlib's jsonl2html): one group per item, one entry per
    rollout, failed ones included (their reward reads "not scored", their stop reason is in the text)."""
    try:
        from atroposlib.frontend.jsonl2html import generate_html
    except ImportError as err:
        raise ConfigError(f"--html needs atroposlib: pip install -e '.[rl]' ({err})") from None
    groups: dict[str, dict[str, list]] = {}
    for record in records:
        item = record.rollout_id.rsplit("/", 1)[0]
        group = groups.setdefault(item, {"messages": [], "scores": []})
        text = format_rollout(record).replace("```", "` ` `")  # a fenced block: agent text is never read as HTML
        group["messages"].append(f"```text\n{text}\n```")
        score = record.result.score if record.result else None
        group["scores"].append("not scored" if score is None else score)
    groups_path = output.with_suffix(".groups.jsonl")
    groups_path.write_text("".join(json.dumps(group) + "\n" for group in groups.values()), encoding="utf-8")
    html_path = output.with_suffix(".html")
    generate_html(str(groups_path), str(html_path))
    return html_path


async def cmd_export(args: argparse.Namespace, settings: Settings) -> int:
    client, transcripts = await inspection_client(settings)
    output = Path(args.output) if args.output else settings.data_dir / "exports" / f"{args.batch_id}.rollouts.jsonl"
    summary = await export_batch(client, transcripts, args.batch_id, output)
    if args.html:
        records = [RolloutRecord.model_validate_json(line) for line in output.read_text(encoding="utf-8").splitlines()]
        summary["html"] = str(write_atropos_html(records, output))
    if args.json:
        print(json.dumps(summary))
    else:
        counts = ", ".join(f"{k} {v}" for k, v in sorted(summary["statuses"].items())) or "none found"
        print(f"wrote {summary['rollouts']} rollout(s) of {args.batch_id} ({counts}) to {output}")
        if summary.get("html"):
            print(f"and the Atropos viewer's page to {summary['html']}")
    return 0


async def cmd_list(args: argparse.Namespace, settings: Settings) -> int:
    if args.batch_id is None:
        refuse_filters_without_a_batch(args)
    client, _ = await inspection_client(settings)
    if args.batch_id is not None:
        return await cmd_list_rollouts(client, args)
    batches = await list_batches(client, args.limit or BATCHES_LISTED)
    if args.json:
        print(json.dumps([b.model_dump(mode="json") for b in batches]))
        return 0
    if not batches:
        print(f"no batches on {settings.temporal_address} (namespace {settings.temporal.namespace})")
        return 0
    print("\n".join(batch_lines(batches, screen_width())))
    return 0


BATCH_COLUMNS = [
    Column("batch"),
    Column("status"),
    Column("done", right=True),
    Column("failed", right=True),
    Column("score", right=True),
    Column("started"),
    Column("running", right=True, optional=True),
    Column("env", optional=True),
    Column("policy", optional=True),
]


def batch_lines(batches: list[BatchSummary], width: int | None) -> list[str]:
    """`rollouts list`: a row per batch (done: rollouts scored or failed, of all), and under a running
    batch whose rollouts wait on retries, why."""

    def num(value: int | None) -> str:
        return "-" if value is None else str(value)

    rows = [
        (
            b.batch_id,
            b.outcome,
            "-" if b.total is None else f"{(b.completed or 0) + (b.failed or 0)}/{b.total}",
            num(b.failed),
            "-" if b.mean_score is None else f"{b.mean_score:.2f}",
            when(b.started_at),
            num(b.running),
            b.env or "-",
            b.policy or "-",
        )
        for b in batches
    ]
    return table_lines(BATCH_COLUMNS, rows, width, [[f"  ! {note}" for note in b.retrying] for b in batches])


async def cmd_cancel(args: argparse.Namespace, settings: Settings) -> int:
    """Cancel a batch: its running rollouts are cancelled too, and each releases its slot on the way out."""
    client, _ = await inspection_client(settings)
    described = await require_workflow(client, args.batch_id, "BatchWorkflow")
    if described.status != WorkflowExecutionStatus.RUNNING:
        raise ConfigError(f"batch {args.batch_id} is not running (it is {described.status.name.lower()})")
    await client.get_workflow_handle(args.batch_id).cancel()
    message = {"batch_id": args.batch_id, "status": "cancel_requested"}
    print(
        json.dumps(message)
        if args.json
        else f"cancelling {args.batch_id}: its running rollouts stop and give their slots back"
    )
    return 0


async def cmd_view(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the web page of temporal_rollouts/view until Ctrl-C."""
    import uvicorn

    from temporal_rollouts.sandbox_server.hosts import AllowedHosts
    from temporal_rollouts.sandbox_server.keys import key_from_env, require_key
    from temporal_rollouts.view.app import create_app

    from temporal_rollouts.sandbox.pool import SandboxPool

    key = key_from_env(args.api_key_env)
    require_key(args.host, key, "rollouts view")  # it shows every conversation
    client, transcripts = await inspection_client(settings)
    origins = [settings.ui_url.rstrip("/")] if settings.ui_url else []
    pool = SandboxPool.from_settings(settings)
    app = create_app(
        client, transcripts, origins, AllowedHosts.for_bind(args.host, args.allowed_hosts), key, sandboxes=pool.describe
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    opened = f"?key=<the key in ${args.api_key_env}>" if key else ""
    print(
        f"rollouts view: http://{args.host}:{args.port}/{opened}  (Temporal {settings.temporal_address}; Ctrl-C stops it)\n"
        f"codec endpoint for the Temporal UI: http://{args.host}:{args.port}/codec",
        flush=True,
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await pool.aclose()
    return 0
