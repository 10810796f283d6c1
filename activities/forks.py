"""The two ways a fork rebuilds its workspace when no snapshot of its turn exists.

A live branch copies its parent's workspace while the parent waits for it: inside the
container when both slots are there (the sandbox server copies it in place), else through
a gzipped tar on this worker. The copy counts only if the parent still waited when it
ended (asked afterwards: a parent that waited through the whole copy changed nothing), else
the branch restores the snapshot the parent saved before going on, or replays.

A replay runs the recorded tool calls 1..K again in a fresh slot, in order, under call ids
of this run (a retried step is answered from the sandbox's journal, never runs a call
twice), and compares each result with the recorded one. A difference is a divergence: the
fork says so before its model runs, and stops unless it was allowed to go on.
"""

from __future__ import annotations

import tarfile
import time

from pydantic import BaseModel, Field
from temporalio import activity
from temporalio.client import Client
from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.service import RPCError

from activities.fork_points import session_used
from temporal_rollouts.core.errors import BadToolRequest, LeaseLost, activity_boundary
from temporal_rollouts.core.forks import BRANCH_WAITING, Divergence
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.core.settings import StorageSettings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox.transfer import temp_path
from temporal_rollouts.sandbox_server.schema import DEFAULT_COMMAND_TIMEOUT_S, SlotRef, ToolOutput
from temporal_rollouts.storage.snapshots import turn_snapshot_key
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.tools.catalogue import ToolCallProblem, parse_tool_call, tool_result_message

DIVERGENCES_KEPT = 20
PREVIEW_CHARS = 200


class ReplayInput(BaseModel):
    lease: SlotRef
    transcript: TranscriptRef = Field(description="The prefix whose tool calls run again.")
    setup: TranscriptRef = Field(description="The transcript this fork's own setup started: its prompt must match.")
    default_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S


class ReplayReport(BaseModel):
    calls: int = Field(description="Tool calls run again.")
    divergent: int = Field(default=0, description="Results (the prompt included) that differ from the recorded ones.")
    divergences: list[Divergence] = Field(default_factory=list, description=f"The first {DIVERGENCES_KEPT}.")
    seconds: float = 0.0


class CopyWorkspaceInput(BaseModel):
    source: SlotRef = Field(description="The parent's slot.")
    target: SlotRef
    parent: str
    parent_run: str | None = None
    child: str
    prefix: TranscriptRef = Field(description="The parent's transcript at the branch point.")


class CopyOutcome(BaseModel):
    copied: bool = Field(description="The copy was taken while the parent waited for it: the workspace after turn K.")
    in_place: bool = False
    bytes: int = 0
    seconds: float = 0.0
    fallback_snapshot: str | None = Field(default=None, description="Not copied: the parent's snapshot of that turn.")
    session_used: bool = Field(
        default=False, description="The prefix used the stateful terminal, whose session no copy carries."
    )


class ForkActivities:
    def __init__(
        self,
        client: Client,
        pool: SandboxPool,
        transcripts: TranscriptStore,
        objects: S3StorageDriverClient,
        storage: StorageSettings,
    ) -> None:
        self._client = client
        self._pool = pool
        self._transcripts = transcripts
        self._objects = objects
        self._storage = storage

    @activity.defn(name="replay_tool_calls")
    @checked_input
    async def replay_tool_calls(self, input: ReplayInput) -> ReplayReport:
        with activity_boundary():
            started = time.monotonic()
            prompt, turns = await self._transcripts.recorded_turns(input.transcript)
            fresh, _ = await self._transcripts.recorded_turns(input.setup)
            found: list[Divergence] = []
            if _shown(prompt) != _shown(fresh):
                found.append(
                    Divergence(
                        turn=0,
                        call=0,
                        tool="setup",
                        recorded=_preview(_shown(prompt)),
                        replayed=_preview(_shown(fresh)),
                    )
                )
            allowed = [tool.name for tool in await self._transcripts.offered_tools(input.transcript)]
            info = activity.info()
            calls = 0
            for turn in turns:
                for index, (call, recorded) in enumerate(zip(turn.reply.tool_calls or [], turn.results)):
                    parsed = parse_tool_call(call, allowed, default_timeout_s=input.default_timeout_s)
                    if isinstance(parsed, ToolCallProblem):
                        again = tool_result_message(call.id, parsed)
                    else:
                        call_id = f"{info.workflow_id}/{info.workflow_run_id}/replay/turn-{turn.number}/call-{index}"
                        again = tool_result_message(
                            call.id, await heartbeating(self._run(input.lease, call_id, parsed))
                        )
                        calls += 1
                    activity.heartbeat()
                    if (again.content or "") != (recorded.content or ""):
                        found.append(
                            Divergence(
                                turn=turn.number,
                                call=index,
                                tool=call.function.name[:64],
                                recorded=_preview(recorded.content),
                                replayed=_preview(again.content),
                            )
                        )
            return ReplayReport(
                calls=calls,
                divergent=len(found),
                divergences=found[:DIVERGENCES_KEPT],
                seconds=round(time.monotonic() - started, 3),
            )

    async def _run(self, lease: SlotRef, call_id: str, operation) -> ToolOutput:
        try:
            return await self._pool.lease(lease).execute(call_id, operation)
        except BadToolRequest as err:  # as for the original call: the model's mistake, shown as its result
            return ToolOutput(call_id=call_id, ok=False, output=err.message)

    @activity.defn(name="copy_workspace")
    @checked_input
    async def copy_workspace(self, input: CopyWorkspaceInput) -> CopyOutcome:
        with activity_boundary():
            started = time.monotonic()
            in_place = input.source.container_id == input.target.container_id
            moved = None
            if not (in_place and input.source.slot == input.target.slot):  # else the parent's slot is ours now
                try:
                    moved = await heartbeating(self._copy(input, in_place))
                except LeaseLost:  # the parent has released its slot: it has long stopped waiting
                    pass
            copied = moved is not None and await self._still_awaited(input)
            _, turns = await self._transcripts.recorded_turns(input.prefix)
            outcome = CopyOutcome(
                copied=copied,
                in_place=in_place,
                bytes=moved or 0,
                session_used=session_used(turns),
                seconds=round(time.monotonic() - started, 3),
            )
            if not copied:
                outcome.fallback_snapshot = await self._parent_snapshot(input)
                if outcome.fallback_snapshot is None:
                    await heartbeating(self._empty(input.target))  # a replay starts from a fresh workspace
            return outcome

    async def _copy(self, input: CopyWorkspaceInput, in_place: bool) -> int:
        limit = self._storage.max_snapshot_bytes
        target = self._pool.lease(input.target)
        if in_place:
            return (await target.copy_from(input.source, limit)).bytes
        with temp_path(suffix=".tar.gz") as archive:
            size = await self._pool.lease(input.source).archive_to(archive, limit)
            await target.restore_from(archive, limit)
            return size

    async def _still_awaited(self, input: CopyWorkspaceInput) -> bool:
        try:
            waiting = await self._client.get_workflow_handle(input.parent, run_id=input.parent_run).query(
                BRANCH_WAITING
            )
        except RPCError:
            return False
        return input.child in waiting

    async def _parent_snapshot(self, input: CopyWorkspaceInput) -> str | None:
        key = turn_snapshot_key(input.parent, input.prefix.head)
        return key if await self._objects.object_exists(bucket=self._storage.bucket, key=key) else None

    async def _empty(self, lease: SlotRef) -> None:
        with temp_path(suffix=".tar.gz") as archive:
            with tarfile.open(archive, "w:gz"):
                pass
            await self._pool.lease(lease).restore_from(archive, self._storage.max_snapshot_bytes)


def _shown(messages: list[Message]) -> str:
    return "\n".join(f"[{m.role}] {m.content or ''}" for m in messages)


def _preview(text: str | None) -> str:
    text = text or ""
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"
