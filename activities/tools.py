"""One tool call in the rollout's slot.

The call is read from the assistant message in the transcript store; arguments are
parsed and repaired here. A problem the model caused (unknown tool, broken arguments,
a path outside the workspace) becomes a tool message the model sees, not an activity
failure. The call id (workflow id, run id, call key) is the same for every attempt, on
every worker, so a retried attempt replays the sandbox's stored result. The workflow runs
this as a local activity (see workflows/params.py), which cannot heartbeat.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from temporalio import activity

from temporal_rollouts.core.errors import BadToolRequest, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.records import ToolCallOutcome
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_COMMAND_TIMEOUT_S,
    ExecOp,
    Operation,
    SessionOp,
    SlotRef,
    ToolOutput,
)
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.tools.catalogue import ToolCallProblem, parse_tool_call, tool_result_message

PREVIEW_CHARS = 200
"""How much of a failed call's error and arguments the rollout's tool-error record keeps."""
ARGUMENTS_PREVIEW_CHARS = 100
"""How much of a call's arguments every result shows in the Temporal UI (history stays small)."""


class ToolCallInput(BaseModel):
    lease: SlotRef
    call_key: str = Field(description="Unique within the run, e.g. turn-3/call-0; the sandbox call id adds the run.")
    transcript: TranscriptRef
    assistant: str
    index: int
    default_timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S


class ToolCallResult(BaseModel):
    transcript: TranscriptRef
    error: str | None = None
    name: str | None = Field(
        default=None, description="The tool called; with `error`, for the rollout's tool-error record."
    )
    arguments_preview: str | None = Field(
        default=None,
        description="The start of the call's arguments (longer with `error`), for the UI and the error record.",
    )
    exit_code: int | None = Field(default=None, description="The command's exit code, for tools that run one.")
    replayed: bool = False
    outcome: ToolCallOutcome | None = Field(default=None, description="None in results recorded before it existed.")

    def counted_as(self) -> ToolCallOutcome:
        return self.outcome or ("ok" if self.error is None else "error")


class ToolActivities:
    def __init__(self, pool: SandboxPool, transcripts: TranscriptStore) -> None:
        self._pool = pool
        self._transcripts = transcripts

    @activity.defn(name="tool_call")
    @checked_input
    async def tool_call(self, input: ToolCallInput) -> ToolCallResult:
        with activity_boundary():
            assistant = await self._transcripts.message(input.assistant)
            call = (assistant.tool_calls or [])[input.index]
            allowed = [t.name for t in await self._transcripts.offered_tools(input.transcript)]
            parsed = parse_tool_call(call, allowed, default_timeout_s=input.default_timeout_s)
            replayed, exit_code = False, None
            outcome: ToolCallOutcome = "invalid"
            if isinstance(parsed, ToolCallProblem):
                message, error = tool_result_message(call.id, parsed), f"{parsed.kind}: {parsed.message}"
            else:
                info = activity.info()
                call_id = f"{info.workflow_id}/{info.workflow_run_id}/{input.call_key}"
                running = self._pool.lease(input.lease).execute(call_id, parsed)
                try:
                    output: ToolOutput = await running
                except BadToolRequest as err:  # e.g. a path outside the workspace: the model's mistake
                    output = ToolOutput(call_id=call_id, ok=False, output=err.message)
                message, error, replayed = (
                    tool_result_message(call.id, output),
                    _tool_error(parsed, output),
                    output.replayed,
                )
                outcome = "ok" if error is None else "error"
                exit_code = output.exit_code
            transcript = await self._transcripts.append(input.transcript, [message])
            arguments = call.function.arguments[: PREVIEW_CHARS if error else ARGUMENTS_PREVIEW_CHARS]
            return ToolCallResult(
                transcript=transcript,
                error=error[:PREVIEW_CHARS] if error else None,
                name=call.function.name[:64],
                arguments_preview=arguments,
                exit_code=exit_code,
                replayed=replayed,
                outcome=outcome,
            )


def _tool_error(operation: Operation, output: ToolOutput) -> str | None:
    """A failed tool, not a command that merely exited non-zero (a failing test run is information)."""
    if output.ok:
        return None
    if isinstance(operation, SessionOp) and output.exit_code is not None:
        return None  # a command in the session that exited non-zero, as for `terminal`
    if isinstance(operation, ExecOp) and not output.timed_out and (output.exit_code or 0) >= 0:
        return None
    return output.output[-PREVIEW_CHARS:] or "tool failed"
