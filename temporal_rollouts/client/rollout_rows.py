"""A batch's rollouts as rows: id, status, stop reason, score; filtered as a person filters them.

One listing serves `rollouts list BATCH_ID` and the web page. Rows come from the visibility
store (search attributes), so finding the two zero scores among a thousand rollouts is one
query, not a result read per rollout. A resumed rollout has several runs; a row stands for
its latest run only, so a rollout that failed and was resumed to a score is not listed as
failed. A failed rollout has no score (its search attribute holds 0, which is not one).
Turns and timings live only in each run's result: `read_outcomes` reads them, closed runs only.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Iterable
from datetime import datetime

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionStatus,
    WorkflowFailureError,
)
from temporalio.service import RPCError

from temporal_rollouts.client.records import describe_or_none, natural_key, quoted, status_name
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.defaults import ROLLOUTS_LISTED
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.records import (
    StopReason,
    TrajectoryResult,
    failed_rollout_result,
)

READ_CONCURRENCY = 32
"""Rollout results read at once."""
TREE = "RolloutTreeWorkflow"
LISTED_TYPES = ("BatchWorkflow", "TrainingFeedWorkflow", TREE)
"""What has rollouts to list: a batch, a training run, a fork (or a branching item's tree)."""

STATUS_FILTERS = {
    "running": "Running",
    "completed": "Completed",
    "failed": "Failed",
    "canceled": "Canceled",
    "terminated": "Terminated",
    "timed_out": "TimedOut",
}


class RolloutFilter(BaseModel):
    """What a person narrows a batch's rollouts by; unset fields do not filter."""

    status: str | None = None
    stop_reason: str | None = None
    min_score: float | None = None
    max_score: float | None = None

    @property
    def narrows(self) -> bool:
        return any(value is not None for value in self.model_dump().values())


class RolloutRow(BaseModel):
    rollout_id: str
    run_id: str
    status: str
    item_id: str | None = None
    stop_reason: str | None = None
    score: float | None = Field(default=None, description="None unless the rollout was scored.")
    turns: int | None = Field(default=None, description="Model turns, where the run's result was read.")
    started_at: datetime | None = None
    closed_at: datetime | None = None
    batch_id: str | None = Field(default=None, description="The batch or training run it belongs to, if any.")
    forked_from: str | None = Field(default=None, description="For a fork or a branch: the rollout it began from.")
    fork_turn: int | None = Field(default=None, description="...and the turn of that rollout after which it began.")

    def outside(self, batch_id: str) -> bool:
        """A fork of one of the batch's rollouts started afterwards (`rollouts fork`): listed with the batch,
        never counted in it."""
        return self.batch_id != batch_id


class RolloutOutcome(BaseModel):
    """What a closed run's result adds to its row: the figures people chart."""

    turns: int
    tool_calls: int
    timings: dict[str, float]


def scope_clause(batch_id: str, roots: list[str] | None = None) -> str:
    """Whose rollouts: a batch's or training run's, with the forks of its rollouts (whose ids begin with
    the batch's: `rollouts fork` names a fork after its source); or, given `roots`, a rollout tree's: its
    roots and every branch under them (a branch's id begins with its parent's)."""
    if roots is not None:
        return (
            "("
            + " OR ".join(f"WorkflowId = {quoted(r)} OR WorkflowId STARTS_WITH {quoted(r + '/')}" for r in roots)
            + ")"
        )
    return f"(RolloutBatchId = {quoted(batch_id)} OR RolloutForkedFrom STARTS_WITH {quoted(batch_id + '/')})"


def rollouts_query(batch_id: str, wanted: RolloutFilter, roots: list[str] | None = None) -> str:
    """The visibility query for the rollouts of a batch (or tree: `scope_clause`), filtered; unknown
    filter values are refused."""
    clauses = [scope_clause(batch_id, roots), "WorkflowType = 'TrajectoryWorkflow'"]
    if wanted.status:
        if wanted.status not in STATUS_FILTERS:
            raise ConfigError(f"unknown status {wanted.status!r}: one of {', '.join(STATUS_FILTERS)}")
        clauses.append(f"ExecutionStatus = '{STATUS_FILTERS[wanted.status]}'")
    if wanted.stop_reason:
        if wanted.stop_reason not in {reason.value for reason in StopReason}:
            raise ConfigError(f"unknown stop reason {wanted.stop_reason!r}: one of {', '.join(StopReason)}")
        clauses.append(f"RolloutStopReason = '{wanted.stop_reason}'")
    if wanted.min_score is not None or wanted.max_score is not None:
        clauses.append("ExecutionStatus = 'Completed'")  # only a scored rollout has a score
        if wanted.min_score is not None:
            clauses.append(f"RolloutScore >= {_number(wanted.min_score)}")
        if wanted.max_score is not None:
            clauses.append(f"RolloutScore <= {_number(wanted.max_score)}")
    return " AND ".join(clauses)


def _number(value: float) -> str:
    """A score as the visibility query reads it: plain decimals, never `1e-05`."""
    if not math.isfinite(value):
        raise ConfigError(f"a score bound must be a finite number, not {value}")
    return f"{value:.12f}".rstrip("0").rstrip(".") or "0"


def _row(execution: WorkflowExecution) -> RolloutRow:
    attributes = execution.typed_search_attributes
    scored = execution.status == WorkflowExecutionStatus.COMPLETED
    return RolloutRow(
        rollout_id=execution.id,
        run_id=execution.run_id,
        status=status_name(execution.status),
        item_id=attributes.get(sa.ITEM_ID),
        stop_reason=attributes.get(sa.STOP_REASON),
        score=attributes.get(sa.SCORE) if scored else None,
        started_at=execution.start_time,
        closed_at=execution.close_time,
        batch_id=attributes.get(sa.BATCH_ID),
        forked_from=attributes.get(sa.FORKED_FROM),
        fork_turn=attributes.get(sa.FORK_TURN),
    )


async def _latest_runs(client: Client, query: str, limit: int) -> dict[str, RolloutRow]:
    rows: dict[str, RolloutRow] = {}
    async for execution in client.list_workflows(query, limit=limit):
        row = _row(execution)
        earlier = rows.get(row.rollout_id)
        if earlier is None or (row.started_at and earlier.started_at and row.started_at > earlier.started_at):
            rows[row.rollout_id] = row
    return rows


async def list_rollouts(
    client: Client,
    batch_id: str,
    wanted: RolloutFilter | None = None,
    limit: int = ROLLOUTS_LISTED,
    roots: list[str] | None = None,
) -> list[RolloutRow]:
    """The latest run of each rollout of a batch (or training run, with the forks of its rollouts; or,
    given `roots`, of the tree `batch_id`) that matches `wanted`, in natural order (item-2 before
    item-10, a fork right after the rollout it was forked from)."""
    wanted = wanted or RolloutFilter()
    rows = await _latest_runs(client, rollouts_query(batch_id, wanted, roots), limit)
    if wanted.narrows and rows:
        # An earlier run can match where the latest does not: drop the rows a later, resumed run replaced.
        resumed_query = rollouts_query(batch_id, RolloutFilter(), roots) + " AND RolloutResumedFrom IS NOT NULL"
        resumed = await _latest_runs(client, resumed_query, limit)
        rows = {rid: row for rid, row in rows.items() if not _replaced(row, resumed.get(rid))}
    return sorted(rows.values(), key=lambda row: natural_key(row.rollout_id))


def _replaced(row: RolloutRow, latest_resumed: RolloutRow | None) -> bool:
    if latest_resumed is None or latest_resumed.run_id == row.run_id:
        return False
    return bool(latest_resumed.started_at and row.started_at and latest_resumed.started_at > row.started_at)


async def read_outcome(client: Client, row: RolloutRow) -> RolloutOutcome | None:
    """The turns and timings of a closed run, from its result; None for a run that left none."""
    handle = client.get_workflow_handle(row.rollout_id, run_id=row.run_id)
    try:
        result = TrajectoryResult.model_validate(await handle.result(follow_runs=False))
    except WorkflowFailureError as err:
        result = failed_rollout_result(err.cause)
    except RPCError:
        return None
    if result is None:
        return None
    return RolloutOutcome(turns=result.turns, tool_calls=result.tool_calls, timings=result.timings)


async def read_outcomes(client: Client, rows: Iterable[RolloutRow]) -> dict[str, RolloutOutcome]:
    """Outcomes of the closed runs among `rows`, by rollout id, read `READ_CONCURRENCY` at a time."""
    reading = asyncio.Semaphore(READ_CONCURRENCY)
    closed = [row for row in rows if row.status != "running"]

    async def read(row: RolloutRow) -> RolloutOutcome | None:
        async with reading:
            return await read_outcome(client, row)

    found = await asyncio.gather(*(read(row) for row in closed))
    return {row.rollout_id: outcome for row, outcome in zip(closed, found, strict=True) if outcome is not None}


async def tree_roots(client: Client, tree_id: str, run_id: str) -> list[str]:
    """The root rollouts of a rollout tree (a fork's, or a branching batch item's), from its input."""
    from activities.resume import run_input
    from temporal_rollouts.core.trees import RolloutTreeInput

    return (await run_input(client, tree_id, run_id, RolloutTreeInput)).root_ids


async def rollouts_of(
    client: Client, listed_id: str, wanted: RolloutFilter | None = None, limit: int = ROLLOUTS_LISTED
) -> list[RolloutRow]:
    """`rollouts list ID`: the rows of a batch's, a training run's or a fork's rollouts that match `wanted`,
    each closed one with its turns; a ConfigError naming what `listed_id` is when it has no rollouts to list."""
    described = await describe_or_none(client, listed_id)
    if described is None:
        raise ConfigError(f"no batch, training run or fork with id {listed_id!r} (see `rollouts list`)")
    if described.workflow_type not in LISTED_TYPES:
        raise ConfigError(
            f"{listed_id!r} is a {described.workflow_type}, not a batch, a training run or a fork "
            + ("(`rollouts show` shows a rollout)" if described.workflow_type == "TrajectoryWorkflow" else "")
        )
    roots = await tree_roots(client, listed_id, described.run_id) if described.workflow_type == TREE else None
    rows = await list_rollouts(client, listed_id, wanted, limit=limit, roots=roots)
    outcomes = await read_outcomes(client, rows)
    for row in rows:
        if (outcome := outcomes.get(row.rollout_id)) is not None:
            row.turns = outcome.turns
    return rows
