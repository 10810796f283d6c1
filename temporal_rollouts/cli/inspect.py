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
from temporal_rollouts.cli.help_format import DefaultsHelpFormatter
from temporal_rollouts.cli.list_rollouts import add_filter_arguments, cmd_list_rollouts, refuse_filters_without_a_batch
from temporal_rollouts.cli.records import (
    RolloutRecord,
    batch_rollout_ids,
    list_batches,
    load_rollout,
    require_workflow,
    rollout_branches,
)
from temporal_rollouts.cli.rollout_rows import MAX_ROLLOUTS
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.storage.transcripts import TranscriptStore

TOOL_RESULT_CHARS = 800
"""A tool result longer than this is shown as its head and tail in `rollouts show`."""
BATCHES_LISTED = 20
"""Batches `rollouts list` shows unless --limit says otherwise."""
EXPORT_CONCURRENCY = 16
"""Rollouts `rollouts export` reads at once (each is a describe, a result and a transcript walk)."""


async def inspection_client(settings: Settings) -> tuple[Client, TranscriptStore]:
    """A client that never starts a server (reading must not bring one up) and the transcript store."""
    objects = object_client(settings)
    client = await connect(settings, objects=objects, start_embedded=False)
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
    stop = result.stop_reason.value + (f": {result.stop_detail}" if result.stop_detail else "")
    if result.image:
        out.append(f"image        {result.image}")
    out.append(f"stop reason  {stop}")
    out.append(
        f"score        {result.score:g}" + ("" if result.stop_reason.scored else "  (not scored: the rollout failed)")
    )
    out.append(f"turns        {result.turns}, tool calls {result.tool_calls}, tool errors {len(result.tool_errors)}")
    for error in result.tool_errors:
        out.append(f"  turn {error.turn} {error.tool_name}({error.arguments}): {error.error}")
    if result.verify_details:
        out.append(f"verifier     {json.dumps(result.verify_details, default=str)}")
    if result.timings:
        out.append("timings (s)  " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items()))
    return "\n".join(out)


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
        print(record.model_dump_json(exclude_none=True))
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
            out.write(record.model_dump_json(exclude_none=True) + "\n")
    statuses: dict[str, int] = {}
    for record in records:
        statuses[record.status] = statuses.get(record.status, 0) + 1
    return {"batch_id": batch_id, "output": str(output), "rollouts": len(records), "statuses": statuses}


def write_atropos_html(records: list[RolloutRecord], output: Path) -> Path:
    """The Atropos viewer's HTML (atroposlib's jsonl2html): one group per item, one entry per
    rollout, failed ones included (scored 0, their stop reason in the text)."""
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
        group["scores"].append(record.result.score if record.result else 0.0)
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
    print(
        f"{'batch':<36} {'status':<11} {'env':<15} {'policy':<12} {'total':>5} {'done':>5} {'failed':>6} "
        f"{'running':>7} {'score':>6}  started"
    )
    for b in batches:

        def num(value: int | None) -> str:
            return "-" if value is None else str(value)

        score = "-" if b.mean_score is None else f"{b.mean_score:.2f}"
        started = b.started_at.strftime("%Y-%m-%d %H:%M:%S") if b.started_at else "-"
        print(
            f"{b.batch_id:<36} {b.outcome:<11} {b.env or '-':<15} {b.policy or '-':<12} {num(b.total):>5} "
            f"{num(b.completed):>5} {num(b.failed):>6} {num(b.running):>7} {score:>6}  {started}"
        )
    return 0


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


def add_parsers(sub: argparse._SubParsersAction) -> None:
    show = sub.add_parser("show", help="a rollout's conversation, tool calls, results, stop reason, score and timings")
    show.add_argument(
        "rollout_id", help="e.g. batch-terminal_tasks-1a2b3c4d/item-0/g1 (`rollouts list BATCH_ID` lists them)"
    )
    show.add_argument("--json", action="store_true", help="the whole record as one JSON object")

    export = sub.add_parser("export", help="every rollout of a batch, failed ones included, as JSONL")
    export.add_argument("batch_id")
    export.add_argument(
        "--output", default=None, help="JSONL path (default: <data_dir>/exports/<batch id>.rollouts.jsonl)"
    )
    export.add_argument(
        "--html", action="store_true", help="also write the Atropos viewer's HTML beside it (needs the rl extra)"
    )
    export.add_argument("--json", action="store_true", help="print a JSON summary")

    listing = sub.add_parser(
        "list",
        help="batches, newest first, with their counts; or the rollouts of one batch",
        description="Without BATCH_ID: batches, newest first, with their counts. With it: the "
        "rollouts of that batch or training run (ids for `rollouts show`), filtered.",
    )
    listing.add_argument(
        "batch_id",
        nargs="?",
        default=None,
        metavar="BATCH_ID",
        help="list this batch's (or training run's) rollouts instead",
    )
    listing.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"how many batches (default {BATCHES_LISTED}) or rollouts (default {MAX_ROLLOUTS})",
    )
    add_filter_arguments(listing)
    listing.add_argument("--json", action="store_true")

    view = sub.add_parser(
        "view", help="a local web page of batches, rollouts and trajectories", formatter_class=DefaultsHelpFormatter
    )
    view.add_argument("--host", default="127.0.0.1", help="address to bind (the page has no login: keep it local)")
    view.add_argument("--port", type=int, default=8300)
    view.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        help="another name the page is reached by (repeatable); it refuses every other Host header",
    )

    cancel = sub.add_parser("cancel", help="cancel a running batch; its rollouts release their slots")
    cancel.add_argument("batch_id")
    cancel.add_argument("--json", action="store_true")


async def cmd_view(args: argparse.Namespace, settings: Settings) -> int:
    """Serve the web page of temporal_rollouts/view until Ctrl-C."""
    import uvicorn

    from temporal_rollouts.sandbox_server.hosts import AllowedHosts
    from temporal_rollouts.view.app import create_app

    from temporal_rollouts.sandbox.pool import SandboxPool

    client, transcripts = await inspection_client(settings)
    origins = [settings.ui_url.rstrip("/")] if settings.ui_url else []
    pool = SandboxPool.from_settings(settings)
    app = create_app(
        client, transcripts, origins, AllowedHosts.for_bind(args.host, args.allowed_hosts), sandboxes=pool.describe
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    print(
        f"rollouts view: http://{args.host}:{args.port}/  (Temporal {settings.temporal_address}; Ctrl-C stops it)\n"
        f"codec endpoint for the Temporal UI: http://{args.host}:{args.port}/codec",
        flush=True,
    )
    try:
        await uvicorn.Server(config).serve()
    finally:
        await pool.aclose()
    return 0


COMMANDS = {"show": cmd_show, "export": cmd_export, "list": cmd_list, "cancel": cmd_cancel, "view": cmd_view}
