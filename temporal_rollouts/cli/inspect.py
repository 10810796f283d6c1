"""`rollouts show`, `export`, `list` and `cancel`: read what agents did, and stop a batch.

Everything here reads through temporal_rollouts/client/records.py, which joins a
rollout's result in Temporal with its conversation in the object store; these functions
only print. Text output is for people (tool results cut to a readable length); `--json`
and `export` give everything.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from temporal_rollouts.cli.list_rollouts import cmd_list_rollouts, refuse_filters_without_a_batch
from temporal_rollouts.cli.screen import Column, screen_width, table_lines, when
from temporal_rollouts.client.batches import cancel_batch
from temporal_rollouts.client.connection import inspection_client
from temporal_rollouts.client.exports import export_batch
from temporal_rollouts.client.records import (
    BatchSummary,
    RolloutRecord,
    RolloutResult,
    list_batches,
    load_rollout,
    rollout_branches,
)
from temporal_rollouts.core.defaults import BATCHES_LISTED
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.settings import Settings

TOOL_RESULT_CHARS = 800
"""A tool result longer than this is shown as its head and tail in `rollouts show`."""


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
    out += _harness_lines(result)
    out += _verifier_lines(result.verify_details)
    if result.timings:
        out.append("timings (s)  " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items()))
    return "\n".join(out)


VERIFIER_OUTPUT_LINES = 40


def _verifier_lines(details: dict) -> list[str]:
    """The verdict's details on one line, and what the verifier printed (its `output`) as the lines it printed."""
    details = dict(details or {})
    output = details.pop("output", None)
    lines = [f"verifier     {json.dumps(details, default=str)}"] if details else []
    if isinstance(output, str) and output.strip():
        lines.append("verifier output (its end):")
        lines += [f"  {line}" for line in output.rstrip().splitlines()[-VERIFIER_OUTPUT_LINES:]]
    return lines


def _harness_lines(result: RolloutResult) -> list[str]:
    """The harness that ran as the agent: its calls and how it ended, with the end of what it printed."""
    harness = result.harness
    if harness is None:
        return []
    ended = "still running or never ended"
    if (exit := harness.exit) is not None:
        ended = "stopped at a limit" if exit.stopped else f"exited with status {exit.exit_code}"
    restarted = f", started {harness.starts} times" if harness.starts > 1 else ""
    lines = [
        f"harness      {harness.spec.name}: {harness.calls} calls, {harness.rewrites} rewrites{restarted}; {ended}"
    ]
    for name, tail in (("stdout", exit.stdout_tail if exit else ""), ("stderr", exit.stderr_tail if exit else "")):
        if tail.strip():
            lines += [f"  {name} (end):", _indent(cut(tail.strip()))]
    return lines


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
    await cancel_batch(client, args.batch_id)
    message = {"batch_id": args.batch_id, "status": "cancel_requested"}
    print(
        json.dumps(message)
        if args.json
        else f"cancelling {args.batch_id}: its running rollouts stop and give their slots back"
    )
    return 0
