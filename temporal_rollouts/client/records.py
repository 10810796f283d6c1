"""What a person reads about rollouts and batches: one record per rollout, one summary per batch.

A rollout's result lives in Temporal (a completed run's result, or the TrajectoryResult a
failed run carries in its failure, or the `resume_state` query of one still running or
killed from outside); its conversation lives in the object store as a hash chain
(storage/transcripts.py). This module joins the two, so `rollouts show`, `rollouts
export` and `rollouts view` read failed rollouts exactly as they read scored ones.
Batches and their rollouts are found through visibility queries on the project's search
attributes, the same filters a person types in the Temporal UI.
"""

from __future__ import annotations

import asyncio
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, Field, computed_field
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.service import RPCError, RPCStatusCode

from activities.resume import run_result
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.defaults import BATCHES_LISTED
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.records import BatchProgress, BatchResult, StopReason, TrajectoryResult
from temporal_rollouts.storage.transcripts import TranscriptStore

_SAFE_ID = re.compile(r"^[\w./:@-]+$")
QUERY_TIMEOUT = timedelta(seconds=5)
"""A query of a closed batch needs a worker to replay it; without one, its counts are left out."""


class BranchLink(BaseModel):
    """A rollout forked or branched from another, as `rollouts show` lists it under its parent."""

    rollout_id: str
    at_turn: int | None = None
    status: str


CLOSED_FROM_OUTSIDE = {
    WorkflowExecutionStatus.TERMINATED: StopReason.TERMINATED,
    WorkflowExecutionStatus.TIMED_OUT: StopReason.TIMED_OUT,
    WorkflowExecutionStatus.CANCELED: StopReason.CANCELLED,
}
"""How a run ended that never recorded why itself (its state was read back by replay)."""


class RolloutResult(TrajectoryResult):
    """A rollout's result as a person reads it: what the run recorded, except that its stop reason
    appears only once it has stopped, and its score only once it was scored. A running rollout's
    state holds a placeholder reason and a score of 0, and a failed one's score is no score (the
    docs and the trainer never read a failure as 0): both are None here, never shown as values."""

    stop_reason: StopReason | None = None  # type: ignore[assignment]
    score: float | None = None  # type: ignore[assignment]

    @property
    def failed(self) -> bool:
        return self.stop_reason is not None and not self.stop_reason.scored

    @classmethod
    def of(cls, result: TrajectoryResult, status: WorkflowExecutionStatus | None) -> RolloutResult:
        shown = cls.model_validate(result.model_dump())
        if status == WorkflowExecutionStatus.RUNNING:
            shown.stop_reason, shown.stop_detail = None, ""
        elif status in CLOSED_FROM_OUTSIDE and (shown.stop_reason is None or shown.stop_reason.scored):
            shown.stop_reason = CLOSED_FROM_OUTSIDE[status]
            shown.stop_detail = shown.stop_detail or f"the run was {status.name.lower()} from outside"
        if status != WorkflowExecutionStatus.COMPLETED or shown.failed:
            shown.score = None
        return shown


class RolloutRecord(BaseModel):
    """One rollout as a person reads it: how its latest run stands, its result and its conversation."""

    rollout_id: str
    run_id: str | None = None
    status: str = Field(description="running, completed, failed, canceled, terminated, timed_out, ...")
    phase: str | None = Field(
        default=None, description="While it runs: the step it is at (acquire, setup, turn 3, tool 3.1, verify, ...)."
    )
    batch_id: str | None = None
    policy: str | None = None
    started_at: datetime | None = None
    closed_at: datetime | None = None
    result: RolloutResult | None = None
    messages: list[Message] = Field(default_factory=list)
    transcript_error: str | None = Field(default=None, description="Why the conversation could not be read, if so.")
    branches: list[BranchLink] = Field(default_factory=list, description="Rollouts forked or branched from this one.")

    def shown(self) -> dict[str, Any]:
        """The record as `show --json`, `export` and the web page give it: unset fields left out, except a
        result's stop reason and score, which say null while the rollout has none (never a 0 that is no score)."""
        data = self.model_dump(mode="json", exclude_none=True)
        if "result" in data:
            data["result"] = {"stop_reason": None, "score": None, **data["result"]}
        return data


class BatchSummary(BaseModel):
    """One batch in `rollouts list`: its state and counts."""

    batch_id: str
    status: str
    env: str | None = None
    policy: str | None = None
    started_at: datetime | None = None
    total: int | None = None
    completed: int | None = None
    failed: int | None = None
    running: int | None = None
    mean_score: float | None = None
    retrying: list[str] = Field(
        default_factory=list,
        description="While it runs: its rollouts whose step failed and waits for a retry, one line per cause "
        "(`2 rollouts waiting on llm_turn: model unreachable: connection refused, retry 3`).",
    )

    @computed_field
    @property
    def outcome(self) -> str:
        """What became of the batch, for people: `failed` when no rollout of a finished batch was
        scored, `partial` when some failed, else its workflow status (`completed`, `running`, ...)."""
        return batch_outcome(self.status, self.completed, self.failed)


def batch_outcome(status: str, completed: int | None, failed: int | None) -> str:
    """The one definition of a batch's state that `rollouts status`, `rollouts list` and the web page
    show: its workflow status, except that a completed batch with failed rollouts is `partial`, or
    `failed` when none was scored."""
    if status != "completed" or not failed:
        return status
    return "partial" if completed else "failed"


FIRST_STARTED = "first_started_at"
"""Memo of a resumed batch run: when the batch's first run started (a resume starts a new run)."""


async def first_started_at(client: Client, execution: WorkflowExecution) -> datetime | None:
    """When a batch first started: the start of the first run of its chain of runs (a long batch
    continues as new), or of the run it was resumed from, which a resumed run carries in its memo
    (and passes on as it continues as new). A listed run does not name its chain's first run; a
    description does."""
    memo = await execution.memo()
    if isinstance(memo.get(FIRST_STARTED), str):
        return datetime.fromisoformat(memo[FIRST_STARTED])
    try:
        if not execution.raw_info.first_run_id:
            execution = await client.get_workflow_handle(execution.id, run_id=execution.run_id).describe()
        first_run = execution.raw_info.first_run_id
        if first_run and first_run != execution.run_id:
            return (await client.get_workflow_handle(execution.id, run_id=first_run).describe()).start_time
    except RPCError:
        pass
    return execution.start_time


def root_cause(err: BaseException) -> str:
    """The innermost message of a Temporal failure chain (`unknown env 'x': ...`, not `Activity task failed`)."""
    message = str(err)
    cause: BaseException | None = err
    while cause is not None:
        text = getattr(cause, "message", None) or str(cause)
        if text:
            message = text
        cause = getattr(cause, "cause", None) or cause.__cause__
    return message


def status_name(status: WorkflowExecutionStatus | None) -> str:
    return status.name.lower() if status else "unknown"


def quoted(value: str) -> str:
    """A value for a visibility query; ids with quotes or spaces are refused rather than escaped."""
    if not _SAFE_ID.match(value):
        raise ConfigError(f"{value!r} is not a valid workflow id")
    return f"'{value}'"


async def describe_or_none(client: Client, workflow_id: str):
    try:
        return await client.get_workflow_handle(workflow_id).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise


async def id_taken(client: Client, workflow_id: str) -> ConfigError:
    """The error for an id a person chose (`--id`) that an earlier workflow holds: a batch or fork is never
    started anew under it without a word (Temporal would start a second run, and the first would vanish
    behind it from `rollouts list` and `status`)."""
    described = await describe_or_none(client, workflow_id)
    state = status_name(described.status) if described else "gone"
    if described is not None and described.workflow_type == "BatchWorkflow":
        if described.status == WorkflowExecutionStatus.RUNNING:
            return ConfigError(f"batch {workflow_id} is running: watch it with `rollouts status {workflow_id}`")
        counts = await batch_counts(client, workflow_id, described.status)
        state = batch_outcome(state, counts.get("completed"), counts.get("failed"))
        return ConfigError(
            f"batch {workflow_id} already ran (it is {state}): choose another --id for a new batch; "
            f"`rollouts resume {workflow_id}` resumes its failed rollouts"
        )
    kind = described.workflow_type if described else "workflow"
    return ConfigError(f"--id {workflow_id!r} is taken by a {kind} (it is {state}): choose another")


async def require_workflow(client: Client, workflow_id: str, kind: str):
    """The description of a workflow of type `kind`, or a ConfigError naming what was found instead."""
    described = await describe_or_none(client, workflow_id)
    if described is None:
        noun = "batch" if kind == "BatchWorkflow" else "rollout"
        raise ConfigError(f"no {noun} with id {workflow_id!r} (see `rollouts list`)")
    if described.workflow_type != kind:
        raise ConfigError(f"{workflow_id!r} is a {described.workflow_type}, not a {kind}")
    return described


async def load_rollout(client: Client, transcripts: TranscriptStore, rollout_id: str) -> RolloutRecord:
    """The latest run of a rollout, with its result and conversation; failed runs included."""
    described = await require_workflow(client, rollout_id, "TrajectoryWorkflow")
    status = status_name(described.status)
    phase = None
    if described.status == WorkflowExecutionStatus.RUNNING:
        handle = client.get_workflow_handle(rollout_id, run_id=described.run_id)
        try:
            raw = await handle.query("resume_state", rpc_timeout=QUERY_TIMEOUT)
            result = TrajectoryResult.model_validate(raw) if raw else None
            phase = (await handle.query("progress", rpc_timeout=QUERY_TIMEOUT) or {}).get("phase")
        except RPCError:
            result = None
    else:
        result = await run_result(client, rollout_id, described.run_id)
    attributes = described.typed_search_attributes
    record = RolloutRecord(
        rollout_id=rollout_id,
        run_id=described.run_id,
        status=status,
        phase=phase,
        result=RolloutResult.of(result, described.status) if result is not None else None,
        batch_id=attributes.get(sa.BATCH_ID),
        policy=attributes.get(sa.POLICY),
        started_at=described.start_time,
        closed_at=described.close_time,
    )
    if result is not None and result.transcript is not None:
        try:
            record.messages = await transcripts.load(result.transcript)
        except Exception as err:  # a store that lost objects must not hide the result
            record.transcript_error = f"{type(err).__name__}: {err}"
    return record


async def rollout_branches(client: Client, rollout_id: str) -> list[BranchLink]:
    """Every rollout forked or branched from `rollout_id` (search attribute RolloutForkedFrom), by turn;
    a resumed branch is listed once, as its latest run stands."""
    query = f"RolloutForkedFrom = {quoted(rollout_id)} AND WorkflowType = 'TrajectoryWorkflow'"
    latest: dict[str, BranchLink] = {}
    async for execution in client.list_workflows(query):
        if execution.id not in latest:
            turn = execution.typed_search_attributes.get(sa.FORK_TURN)
            latest[execution.id] = BranchLink(
                rollout_id=execution.id, at_turn=turn, status=status_name(execution.status)
            )
    return sorted(latest.values(), key=lambda link: (link.at_turn or 0, natural_key(link.rollout_id)))


async def batch_rollout_ids(client: Client, batch_id: str) -> list[str]:
    """Every rollout of a batch, in item and group order (a resumed rollout is listed once)."""
    query = f"RolloutBatchId = {quoted(batch_id)} AND WorkflowType = 'TrajectoryWorkflow'"
    ids = {execution.id async for execution in client.list_workflows(query)}
    return sorted(ids, key=natural_key)


def natural_key(value: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", value)]


async def batch_counts(
    client: Client, batch_id: str, status: WorkflowExecutionStatus | None, run_id: str | None = None
) -> dict[str, Any]:
    """Counts of a batch: its result when it completed, else its `progress` query."""
    handle = client.get_workflow_handle(batch_id, run_id=run_id)
    try:
        if status == WorkflowExecutionStatus.COMPLETED:
            result = BatchResult.model_validate(await handle.result(follow_runs=False))
            return {
                "total": result.total,
                "completed": result.completed,
                "failed": result.failed,
                "running": 0,
                "mean_score": result.mean_score,
            }
        raw = await handle.query("progress", rpc_timeout=QUERY_TIMEOUT)
    except (RPCError, WorkflowFailureError):  # no worker to answer, or a batch that failed before it counted
        return {}
    if not raw:
        return {}
    progress = BatchProgress.model_validate(raw)
    return {
        "total": progress.total,
        "completed": progress.completed,
        "failed": progress.failed,
        "running": progress.running if status == WorkflowExecutionStatus.RUNNING else 0,
        "mean_score": progress.mean_score,
    }


async def list_batches(
    client: Client,
    limit: int = BATCHES_LISTED,
    closed_counts: dict[str, dict[str, Any]] | None = None,
    first_starts: dict[str, datetime | None] | None = None,
) -> list[BatchSummary]:
    """The latest `limit` batches, newest first, with their counts. `closed_counts` and `first_starts`
    (by run id) keep what never changes between calls: the counts of closed runs, when chains began."""
    summaries: list[BatchSummary] = []
    seen: set[str] = set()
    async for execution in client.list_workflows("WorkflowType = 'BatchWorkflow'"):
        if execution.id in seen:
            continue
        seen.add(execution.id)
        attributes = execution.typed_search_attributes
        if closed_counts is not None and execution.run_id in closed_counts:
            counts = closed_counts[execution.run_id]
        else:
            counts = await batch_counts(client, execution.id, execution.status, execution.run_id)
            if closed_counts is not None and counts and execution.status != WorkflowExecutionStatus.RUNNING:
                closed_counts[execution.run_id] = counts
        summaries.append(
            BatchSummary(
                batch_id=execution.id,
                status=status_name(execution.status),
                env=attributes.get(sa.ENV),
                policy=attributes.get(sa.POLICY),
                started_at=await _first_start(client, execution, first_starts),
                **counts,
            )
        )
        if len(summaries) >= limit:
            break
    running = [summary for summary in summaries if summary.status == "running"]
    found = await asyncio.gather(*(waiting_on_retries(client, s.batch_id, RETRIES_SAMPLED) for s in running))
    for summary, notes in zip(running, found, strict=True):
        summary.retrying = retry_summary(notes)
    return summaries


async def _first_start(
    client: Client, execution: WorkflowExecution, known: dict[str, datetime | None] | None
) -> datetime | None:
    if known is None:
        return await first_started_at(client, execution)
    if execution.run_id not in known:
        known[execution.run_id] = await first_started_at(client, execution)
    return known[execution.run_id]


class RetryNote(BaseModel):
    """A running rollout whose current step failed at least once and waits for its next attempt."""

    rollout_id: str
    activity: str
    attempt: int = Field(description="The attempt Temporal runs next (1 is the first try).")
    error_type: str | None = None
    reason: str = Field(description="The last failure's message, e.g. `model unreachable: connection refused (...)`.")

    @property
    def headline(self) -> str:
        """`model unreachable: connection refused, retry 3`: the message without its parenthesised
        detail; for a slow first attempt, `no answer yet (running 75 s)`."""
        if self.error_type is None and self.reason.startswith("no answer yet"):
            return self.reason + (f", retry {self.attempt - 1}" if self.attempt > 1 else "")
        short = self.reason.split(" (", 1)[0] or self.activity
        return f"{short}, retry {max(self.attempt - 1, 1)}"


SLOW_STEP_S = 60.0
"""A step attempt running this long without an answer is listed too (a stalled model shows before its timeout)."""
RETRIES_SAMPLED = 10
"""Running rollouts of each running batch `rollouts list` and the web page's list look at for retries."""


def pending_notes(workflow_id: str, description: Any, slow_after_s: float = SLOW_STEP_S) -> list[RetryNote]:
    """The steps of one workflow that failed and wait for their next attempt, with the last failure and
    the attempt count (what `temporal workflow describe` shows), and those running `slow_after_s` without
    an answer; `description` is the raw DescribeWorkflowExecution answer."""
    now = datetime.now(UTC)
    notes = []
    for pending in description.pending_activities:
        if not pending.HasField("last_failure"):
            if pending.state == PendingActivityState.PENDING_ACTIVITY_STATE_STARTED and pending.HasField(
                "last_started_time"
            ):
                running = (now - pending.last_started_time.ToDatetime(tzinfo=UTC)).total_seconds()
                if running >= slow_after_s:
                    notes.append(
                        RetryNote(
                            rollout_id=workflow_id,
                            activity=pending.activity_type.name,
                            attempt=pending.attempt,
                            reason=f"no answer yet (running {running:.0f} s)",
                        )
                    )
            continue
        failure = pending.last_failure
        error_type = failure.application_failure_info.type if failure.HasField("application_failure_info") else None
        notes.append(
            RetryNote(
                rollout_id=workflow_id,
                activity=pending.activity_type.name,
                attempt=pending.attempt,
                error_type=error_type or None,
                reason=failure.message,
            )
        )
    return notes


async def waiting_on_retries(
    client: Client, batch_id: str, limit: int = 50, slow_after_s: float = SLOW_STEP_S
) -> list[RetryNote]:
    """Rollouts of a running batch whose step is being retried, and why, or whose current
    attempt has run `slow_after_s` without an answer, from Temporal's pending-activity
    information (describe of each running rollout, at most `limit`)."""
    query = (
        f"RolloutBatchId = {quoted(batch_id)} AND WorkflowType = 'TrajectoryWorkflow' AND ExecutionStatus = 'Running'"
    )
    notes: list[RetryNote] = []
    checked = 0
    async for execution in client.list_workflows(query):
        checked += 1
        if checked > limit:
            break
        try:
            described = await client.get_workflow_handle(execution.id, run_id=execution.run_id).describe()
        except RPCError:
            continue
        notes += pending_notes(execution.id, described.raw_description, slow_after_s)
    return sorted(notes, key=lambda note: natural_key(note.rollout_id))


def retry_summary(notes: list[RetryNote]) -> list[str]:
    """One line per distinct cause: `4 rollouts: model unreachable: connection refused, retry 3` (the highest retry)."""
    by_cause: dict[str, list[RetryNote]] = {}
    for note in notes:
        by_cause.setdefault(note.reason.split(" (", 1)[0], []).append(note)
    lines = []
    for group in by_cause.values():
        worst = max(group, key=lambda note: note.attempt)
        count = f"{len(group)} rollout{'s' if len(group) > 1 else ''}"
        lines.append(f"{count} waiting on {worst.activity}: {worst.headline}")
    return lines
