"""One tool call in the rollout's slot.

Arguments are parsed and repaired here; a problem the model caused (unknown tool,
broken arguments) becomes a tool message the model sees, not an activity failure.
The call id makes a retried attempt replay the sandbox's stored result.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity

from activities.heartbeat import heartbeating
from rollouts.errors import BadToolRequest, activity_boundary
from rollouts.messages import Message, ToolCall
from sandboxes.pool import SandboxPool
from sandboxes.schema import ExecOp, Operation, SlotLease, ToolOutput
from sandboxes.tools import ToolCallProblem, parse_tool_call, tool_result_message


class ToolCallInput(BaseModel):
    lease: SlotLease
    call_id: str
    call: ToolCall
    allowed_tools: list[str]
    default_timeout_s: float = 60.0


class ToolCallResult(BaseModel):
    message: Message
    error: str | None = None
    replayed: bool = False


class ToolActivities:
    def __init__(self, pool: SandboxPool) -> None:
        self._pool = pool

    @activity.defn(name="tool_call")
    async def tool_call(self, input: ToolCallInput) -> ToolCallResult:
        with activity_boundary():
            parsed = parse_tool_call(input.call, input.allowed_tools, default_timeout_s=input.default_timeout_s)
            if isinstance(parsed, ToolCallProblem):
                return ToolCallResult(
                    message=tool_result_message(input.call.id, parsed), error=f"{parsed.kind}: {parsed.message}"
                )
            try:
                output: ToolOutput = await heartbeating(self._pool.execute(input.lease, input.call_id, parsed))
            except BadToolRequest as err:  # e.g. a path outside the workspace: the model's mistake
                output = ToolOutput(call_id=input.call_id, ok=False, output=err.message)
            return ToolCallResult(
                message=tool_result_message(input.call.id, output), error=_tool_error(parsed, output),
                replayed=output.replayed,
            )


def _tool_error(operation: Operation, output: ToolOutput) -> str | None:
    """A failed tool, not a command that merely exited non-zero (a failing test run is information)."""
    if output.ok:
        return None
    if isinstance(operation, ExecOp) and not output.timed_out and (output.exit_code or 0) >= 0:
        return None
    return output.output[-500:] or "tool failed"
