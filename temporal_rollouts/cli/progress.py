"""The batch progress display, summaries, `rollouts status` and the exit codes of batch commands.

What a person watching a batch sees (the bar, the rollouts waiting on retries and why, the
summary) and how that becomes an exit code; the figures come from client/batches.py.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from typing import Any

from rich.console import Console
from rich.table import Table
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.service import RPCError

from temporal_rollouts.cli.progress_bar import BatchBar
from temporal_rollouts.cli.screen import wrapped
from temporal_rollouts.client.batches import batch_progress, summary_json
from temporal_rollouts.client.records import retry_summary, root_cause, waiting_on_retries
from temporal_rollouts.core.records import BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.exit_codes import EXIT_FAILED, batch_exit_code

RETRY_CHECK_S = 3.0
"""How often the progress display asks Temporal which rollouts are waiting on retries."""


async def watch(client: Client, handle: WorkflowHandle, console: Console) -> BatchResult:
    """A progress bar until the batch finishes; returns its result. Rollouts waiting on retries
    show under the bar with the cause (`model unreachable: connection refused, retry 3`)."""
    result_task = asyncio.ensure_future(handle.result())
    retry_lines: list[str] = []
    next_retry_check = time.monotonic() + RETRY_CHECK_S
    with BatchBar(console, handle.id) as bar:
        task = bar.add_task(handle.id, total=None)
        bar.notes = [("loading items", "")]
        while not result_task.done():
            try:
                progress = await batch_progress(handle)
                if time.monotonic() >= next_retry_check:
                    retry_lines = retry_summary(await waiting_on_retries(client, handle.id))
                    next_retry_check = time.monotonic() + RETRY_CHECK_S
            except RPCError:
                progress = None
            if progress:
                bar.show(progress, retry_lines)
                bar.update(task, total=progress.total, completed=progress.completed + progress.failed)
            await asyncio.wait({result_task}, timeout=0.5)
        result = BatchResult.model_validate(result_task.result())
        bar.notes = []
        bar.update(task, total=result.total, completed=result.completed + result.failed)
    return result


def print_summary(result: BatchResult, console: Console, settings: Settings, policy: str | None = None) -> None:
    table = Table(title=f"batch {result.batch_id}", show_header=False)
    if policy:
        table.add_row("policy", policy)
    if result.items is not None:
        table.add_row("items", f"{result.items} ({result.distinct_items} distinct)")
    table.add_row("rollouts", f"{result.total} ({result.completed} scored, {result.failed} failed)")
    table.add_row("mean score", f"{result.mean_score:.3f}" if result.mean_score is not None else "-")
    table.add_row("stop reasons", ", ".join(f"{k}: {v}" for k, v in sorted(result.stop_reasons.items())))
    for reason, detail in sorted(result.stop_details.items()):
        table.add_row(f"why {reason}", detail)
    table.add_row("groups written", str(result.groups_written))
    if result.groups_pending:
        table.add_row(
            "groups pending", f"{result.groups_pending} (a member failed: `rollouts resume {result.batch_id}`)"
        )
    if result.resumed:
        table.add_row("resumed", str(result.resumed))
    console.print(table)
    console.print(f"results:     {result.output}", soft_wrap=True)
    if settings.ui_url:
        page = f"{settings.ui_url}/namespaces/{settings.temporal.namespace}/workflows/{result.batch_id}"
        console.print(f"Temporal UI: {page}", soft_wrap=True)


async def finish(
    client: Client,
    handle: WorkflowHandle,
    console: Console,
    settings: Settings,
    *,
    as_json: bool,
    extra: dict[str, Any] | None = None,
    policy: str | None = None,
) -> int:
    try:
        result = await watch(client, handle, console)
    except WorkflowFailureError as err:
        message = f"batch {handle.id} failed: {root_cause(err)}"
        print(
            json.dumps({"batch_id": handle.id, "error": message}) if as_json else message,
            file=sys.stdout if as_json else sys.stderr,
        )
        return EXIT_FAILED
    if as_json:
        print(json.dumps({**summary_json(result), **({"policy": policy} if policy else {}), **(extra or {})}))
    else:
        print_summary(result, console, settings, policy)
    return batch_exit_code(result.completed, result.failed)


def format_status(data: dict[str, Any], width: int | None = None) -> str:
    """`rollouts status` for people; a line longer than `width` wraps at its words, under itself."""
    lines = [
        f"batch {data['batch_id']}: {data['status']}" + (f" (policy {data['policy']})" if data.get("policy") else "")
    ]
    if data.get("error"):
        lines.append(f"  error: {data['error']}")
    if data.get("total") is not None:
        counts = f"  {data['total']} rollouts: {data.get('completed', 0)} scored, {data.get('failed', 0)} failed"
        if data["status"] == "running":
            queued = (
                data["total"] - (data.get("completed") or 0) - (data.get("failed") or 0) - (data.get("running") or 0)
            )
            counts += f", {data.get('running') or 0} running, {max(queued, 0)} queued"
        lines.append(counts)
        mean = data.get("mean_score")
        lines.append(f"  mean score: {'-' if mean is None else f'{mean:.3f}'}")
    if data.get("stop_reasons"):
        lines.append("  stop reasons: " + ", ".join(f"{k} {v}" for k, v in sorted(data["stop_reasons"].items())))
    for reason, detail in sorted((data.get("stop_details") or {}).items()):
        lines.append(f"  why {reason}: {detail}")
    notes = data.get("retrying") or []
    if notes:
        lines.append(f"  waiting on retries: {len(notes)}")
        lines += [f"    {note['rollout_id']}: {note['headline']}" for note in notes]
    if data.get("groups_pending"):
        lines.append(
            f"  groups pending: {data['groups_pending']} (a member failed: `rollouts resume {data['batch_id']}`)"
        )
    if data.get("output"):
        lines.append(f"  results: {data['output']}")
    if data.get("total"):
        lines.append(f"  rollouts: `rollouts list {data['batch_id']}` (ids, stop reasons, scores)")
    return "\n".join(part for line in lines for part in wrapped(line, width))
