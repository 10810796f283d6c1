"""Where a fork begins: a rollout's state after turn K, found in what it already stored.

The rollout's result (in Temporal) gives its final transcript and token trace; both are
hash chains (storage/), so the state after turn K is an earlier head of each, found by
walking back, never by generating or storing anything again. Counts the fork takes over
(tool calls, errors, policy versions) are cut at turn K too. A snapshot of the workspace
at that turn is used when one was taken (`snapshot_turns`, a branch point, or the
snapshot of a rollout that failed right after turn K); otherwise the fork replays.
`rollouts fork` calls the same function to say what it will do before it starts anything.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.service import RPCError, RPCStatusCode

from activities.resume import run_result
from temporal_rollouts.core.errors import ConfigError, activity_boundary
from temporal_rollouts.core.forks import SESSION_TOOLS, ForkPrefix
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.records import TrajectoryResult
from temporal_rollouts.core.tool_stats import ToolErrorRecord, ToolStats
from temporal_rollouts.storage.snapshots import turn_snapshot_key
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import RecordedTurn, TranscriptStore

INVALID_CALL_KINDS = ("unknown_tool:", "bad_arguments:")
"""How a tool-error record of a call that never ran begins (activities/tools.py writes `kind: message`)."""


class ForkPointInput(BaseModel):
    source: str
    source_run: str | None = None
    at_turn: int


class ForkPoint(BaseModel):
    prefix: ForkPrefix
    source_run: str
    source_turns: int
    snapshot: str | None = None


class ForkPoints:
    def __init__(
        self,
        client: Client,
        transcripts: TranscriptStore,
        traces: TokenTraceStore,
        objects: S3StorageDriverClient,
        bucket: str,
    ) -> None:
        self._client = client
        self._transcripts = transcripts
        self._traces = traces
        self._objects = objects
        self._bucket = bucket

    @activity.defn(name="load_fork_point")
    @checked_input
    async def load_fork_point(self, input: ForkPointInput) -> ForkPoint:
        with activity_boundary():
            return await self.find(input)

    async def find(self, input: ForkPointInput) -> ForkPoint:
        run, result = await self._source(input.source, input.source_run)
        turn = input.at_turn
        if result.transcript is None:
            raise ConfigError(f"{input.source} left no transcript to fork from")
        if turn > result.turns:
            raise ConfigError(
                f"{input.source} made {result.turns} model turn(s): fork at a turn from 0 to {result.turns}"
            )
        if turn == result.turns and result.pending is not None:
            raise ConfigError(f"turn {turn} of {input.source} did not finish its tool calls: fork at an earlier turn")
        transcript = await self._transcripts.cut(result.transcript, turn)
        prompt, turns = await self._transcripts.recorded_turns(transcript)
        tokens = None
        if result.tokens is not None and turn > 0:
            messages = len(prompt) + sum(1 + len(t.results) for t in turns) - len(turns[-1].results)
            tokens = await self._traces.cut(result.tokens, turn, result.turns, messages)
        errors = [error for error in result.tool_errors if error.turn <= turn]
        prefix = ForkPrefix(
            transcript=transcript,
            tokens=tokens,
            turns=turn,
            tool_calls=sum(len(t.results) for t in turns),
            tool_stats=stats_of(turns, errors),
            tool_errors=errors,
            policy_versions=result.policy_versions[:turn],
            setup_meta=result.setup_meta,
            session_used=session_used(turns),
        )
        return ForkPoint(
            prefix=prefix,
            source_run=run,
            source_turns=result.turns,
            snapshot=await self._snapshot(input.source, run, result, transcript.head, turn),
        )

    async def _source(self, rollout: str, run_id: str | None) -> tuple[str, TrajectoryResult]:
        handle = self._client.get_workflow_handle(rollout, run_id=run_id)
        try:
            described = await handle.describe()
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                raise ConfigError(f"no rollout {rollout}" + (f" with run {run_id}" if run_id else "")) from err
            raise
        if described.workflow_type != "TrajectoryWorkflow":
            raise ConfigError(f"{rollout} is a {described.workflow_type}, not a rollout")
        if described.status == WorkflowExecutionStatus.RUNNING:
            result = TrajectoryResult.model_validate(await handle.query("resume_state"))
        else:
            result = await run_result(self._client, rollout, described.run_id)
        if result is None:
            raise ConfigError(f"{rollout} left no state to fork from")
        return described.run_id, result

    async def _snapshot(self, rollout: str, run: str, result: TrajectoryResult, head: str, turn: int) -> str | None:
        """A saved workspace of exactly that turn: one taken after it, else the snapshot of a run that
        failed in its agent loop right after it (a failure in verify may have changed the files)."""
        candidates = [turn_snapshot_key(rollout, head)]
        if turn == result.turns and result.agent_stop is None and result.pending is None and result.snapshot:
            candidates.append(result.snapshot)
        for key in candidates:
            if await self._objects.object_exists(bucket=self._bucket, key=key):
                return key
        return None


def stats_of(turns: list[RecordedTurn], errors: list[ToolErrorRecord]) -> ToolStats:
    """The prefix's tool calls counted as the rollout counted them: every result is a call attempted;
    an error record that says the call was not valid is one that never ran."""
    attempted = sum(len(t.results) for t in turns)
    invalid = sum(1 for error in errors if error.error.startswith(INVALID_CALL_KINDS))
    failed = len(errors) - invalid
    return ToolStats(
        attempted=attempted,
        schema_valid=attempted - invalid,
        executed_ok=attempted - invalid - failed,
        execution_errors=failed,
    )


def session_used(turns: list[RecordedTurn]) -> bool:
    return any(call.function.name in SESSION_TOOLS for t in turns for call in t.reply.tool_calls or [])
