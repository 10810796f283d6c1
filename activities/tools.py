"""One tool call in the rollout's slot.

The call is read from the assistant message in the transcript store; arguments are
parsed and repaired here. A problem the model caused (unknown tool, broken arguments,
a path outside the workspace) becomes a tool message the model sees, not an activity
failure. The call id makes a retried attempt replay the sandbox's stored result.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from activities.heartbeat import heartbeating
from rollouts.errors import BadToolRequest, activity_boundary
from sandboxes.pool import SandboxPool
from sandboxes.schema import ExecOp, Operation, SlotLease, ToolOutput
from sandboxes.tools import ToolCallProblem, parse_tool_call, tool_result_message
from storage.transcripts import TranscriptRef, TranscriptStore

PREVIEW_CHARS = 500


class ToolCallInput(BaseModel):
    lease: SlotLease
    call_id: str
    transcript: TranscriptRef
    assistant: str
    index: int
    default_timeout_s: float = 60.0


class ToolCallResult(BaseModel):
    transcript: TranscriptRef
    name: str
    arguments_preview: str
    error: str | None = None
    replayed: bool = False


class ToolActivities:
    def __init__(self, pool: SandboxPool, transcripts: TranscriptStore) -> None:
        self._pool = pool
        self._transcripts = transcripts

    @activity.defn(name="tool_call")
    async def tool_call(self, input: ToolCallInput) -> ToolCallResult:
        with activity_boundary():
            assistant = await self._transcripts.message(input.assistant)
            call = (assistant.tool_calls or [])[input.index]
            allowed = [t.name for t in await self._transcripts.tools(input.transcript.tools)] if input.transcript.tools else []
            parsed = parse_tool_call(call, allowed, default_timeout_s=input.default_timeout_s)
            replayed = False
            if isinstance(parsed, ToolCallProblem):
                message, error = tool_result_message(call.id, parsed), f"{parsed.kind}: {parsed.message}"
            else:
                try:
                    output: ToolOutput = await heartbeating(self._pool.execute(input.lease, input.call_id, parsed))
                except BadToolRequest as err:  # e.g. a path outside the workspace: the model's mistake
                    output = ToolOutput(call_id=input.call_id, ok=False, output=err.message)
                message, error, replayed = tool_result_message(call.id, output), _tool_error(parsed, output), output.replayed
            return ToolCallResult(
                transcript=await self._transcripts.append(input.transcript, [message]),
                name=call.function.name,
                arguments_preview=call.function.arguments[:PREVIEW_CHARS],
                error=error[:PREVIEW_CHARS] if error else None,
                replayed=replayed,
            )


def _tool_error(operation: Operation, output: ToolOutput) -> str | None:
    """A failed tool, not a command that merely exited non-zero (a failing test run is information)."""
    if output.ok:
        return None
    if isinstance(operation, ExecOp) and not output.timed_out and (output.exit_code or 0) >= 0:
        return None
    return output.output[-PREVIEW_CHARS:] or "tool failed"
