"""TrajectoryWorkflow: one rollout, each step an activity, the slot released whatever happens.

acquire slot -> set up workspace -> (model turn -> tool calls)* -> verify -> release.
A rollout the model ended (it stopped calling tools, or hit a limit) is verified and
scored. A rollout the machinery ended (model down past its retries, no slot, an env
bug) fails as a workflow, carrying its TrajectoryResult as the failure's details, so
it shows as Failed in the UI and can be resumed.
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.llm import LlmActivities, LlmTurnInput
    from activities.slots import AcquireSlotInput, SlotActivities
    from activities.tools import ToolActivities, ToolCallInput
    from activities.verify import VerifyActivities, VerifyInput
    from activities.workspace import SetupWorkspaceInput, WorkspaceActivities
    from llm.context import estimate_tokens
    from rollouts import search_attributes as sa
    from rollouts.messages import Message
    from rollouts.records import StopReason, ToolErrorRecord, TrajectoryInput, TrajectoryResult
    from sandboxes.schema import SlotLease
    from workflows import params

MAX_COMMAND_TIMEOUT_S = 600.0

# Error types raised by our activities (see rollouts/errors.py) -> why the rollout stopped.
_STOP_FOR_ERROR = {
    "ModelUnavailable": StopReason.MODEL_UNAVAILABLE,
    "ModelRequestRejected": StopReason.MODEL_REJECTED,
    "MalformedModelReply": StopReason.MALFORMED_REPLY,
    "SlotUnavailable": StopReason.SLOT_UNAVAILABLE,
    "BadItem": StopReason.BAD_ITEM,
    "UnknownEnv": StopReason.CONFIG_ERROR,
    "ConfigError": StopReason.CONFIG_ERROR,
    "TaskError": StopReason.ENV_ERROR,
}


class StepFailed(Exception):
    """A step failed for good; carries why the rollout stops."""

    def __init__(self, reason: StopReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def _stop_for(err: ActivityError, phase_default: StopReason) -> StepFailed:
    cause = err.cause
    if isinstance(cause, ApplicationError):
        name = cause.type or ""
        reason = _STOP_FOR_ERROR.get(name)
        if reason is None and (name.startswith("Sandbox") or name in ("SlotUnavailable", "LeaseLost", "BadToolRequest")):
            reason = StopReason.SANDBOX_ERROR
        return StepFailed(reason or phase_default, f"{name}: {cause.message}")
    if isinstance(cause, TimeoutError):
        return StepFailed(phase_default, f"{err.activity_type} timed out ({cause.type.name if cause.type else ''})")
    return StepFailed(phase_default, f"{err.activity_type} failed: {cause or err}")


@workflow.defn(name="TrajectoryWorkflow")
class TrajectoryWorkflow:
    def __init__(self) -> None:
        self._phase = "starting"
        self._result: TrajectoryResult | None = None

    @workflow.query
    def progress(self) -> dict:
        result = self._result
        return {
            "phase": self._phase,
            "turns": result.turns if result else 0,
            "tool_calls": result.tool_calls if result else 0,
        }

    @workflow.run
    async def run(self, input: TrajectoryInput) -> TrajectoryResult:
        info = workflow.info()
        rollout_key = f"{info.workflow_id}/{info.run_id}"
        result = self._result = TrajectoryResult(
            rollout_id=info.workflow_id,
            env=input.env,
            item_id=input.item.id,
            group_index=input.group_index,
            stop_reason=StopReason.COMPLETED,
        )
        started = workflow.now()
        lease: SlotLease | None = None
        try:
            self._phase = "acquire"
            lease = await self._step(
                SlotActivities.acquire_slot, AcquireSlotInput(allow_network=input.allow_network),
                params.ACQUIRE_SLOT, StopReason.SANDBOX_ERROR, "acquire",
            )
            self._phase = "setup"
            ready = await self._step(
                WorkspaceActivities.setup_workspace,
                SetupWorkspaceInput(env=input.env, env_config=input.env_config, item=input.item, lease=lease, rollout_key=rollout_key),
                params.SETUP_WORKSPACE, StopReason.ENV_ERROR, "setup",
            )
            result.messages = list(ready.messages)
            await self._agent_loop(input, lease, rollout_key, [t.name for t in ready.tools], ready.tools)
            if result.stop_reason.scored:
                self._phase = "verify"
                verdict = await self._step(
                    VerifyActivities.verify,
                    VerifyInput(env=input.env, env_config=input.env_config, item=input.item, lease=lease,
                                rollout_key=rollout_key, messages=result.messages),
                    params.VERIFY, StopReason.ENV_ERROR, "verify",
                )
                result.score = verdict.score
                result.verify_details = verdict.details
        except StepFailed as failed:
            result.stop_reason, result.stop_detail = failed.reason, failed.detail
            result.score = 0.0
        except asyncio.CancelledError:
            result.stop_reason, result.stop_detail = StopReason.CANCELLED, "the rollout was cancelled"
            raise
        finally:
            if lease is not None:
                self._phase = "release"
                await self._release(lease)
            self._phase = "done"
            result.timings["total"] = _seconds_since(started)
            workflow.upsert_search_attributes(
                [sa.STOP_REASON.value_set(result.stop_reason.value), sa.SCORE.value_set(result.score)]
            )
        if result.failed:
            raise ApplicationError(
                f"rollout stopped: {result.stop_reason.value}: {result.stop_detail}",
                result,
                type="RolloutFailed",
                non_retryable=True,
            )
        return result

    async def _agent_loop(self, input: TrajectoryInput, lease: SlotLease, rollout_key: str, tool_names, tools) -> None:
        result = self._result
        assert result is not None
        limits = input.limits
        loop_started = workflow.now()
        while True:
            if result.turns >= limits.max_turns:
                return self._stop(StopReason.MAX_TURNS, f"reached {limits.max_turns} turns")
            if _seconds_since(loop_started) >= limits.wall_clock_s:
                return self._stop(StopReason.WALL_CLOCK, f"used the {limits.wall_clock_s:.0f}s budget")
            if estimate_tokens(result.messages) >= limits.context_tokens:
                return self._stop(StopReason.CONTEXT_BUDGET, f"context reached {limits.context_tokens} tokens")
            self._phase = f"turn {result.turns + 1}"
            try:
                turn = await self._step(
                    LlmActivities.llm_turn,
                    LlmTurnInput(policy=input.policy, lease=lease, messages=result.messages, tools=tools, sampling=input.sampling),
                    params.LLM_TURN, StopReason.MODEL_UNAVAILABLE, "llm",
                )
            except StepFailed as failed:
                if failed.reason is StopReason.MALFORMED_REPLY:
                    return self._stop(failed.reason, failed.detail)
                raise
            result.turns += 1
            result.messages.append(turn.message)
            calls = turn.message.tool_calls or []
            if not calls:
                return self._stop(StopReason.COMPLETED, turn.finish_reason or "")
            for index, call in enumerate(calls):
                if result.tool_calls >= limits.max_tool_calls:
                    return self._stop(StopReason.MAX_TOOL_CALLS, f"reached {limits.max_tool_calls} tool calls")
                self._phase = f"tool {result.turns}.{index}"
                outcome = await self._step(
                    ToolActivities.tool_call,
                    ToolCallInput(lease=lease, call_id=f"{rollout_key}/turn-{result.turns}/call-{index}", call=call,
                                  allowed_tools=tool_names, default_timeout_s=limits.command_timeout_s),
                    params.TOOL_CALL, StopReason.SANDBOX_ERROR, "tools",
                    extra_start_to_close_s=MAX_COMMAND_TIMEOUT_S,
                )
                result.tool_calls += 1
                result.messages.append(outcome.message)
                if outcome.error:
                    result.tool_errors.append(ToolErrorRecord(
                        turn=result.turns, tool_name=call.function.name,
                        arguments=call.function.arguments[:500], error=outcome.error[:500],
                    ))

    def _stop(self, reason: StopReason, detail: str) -> None:
        assert self._result is not None
        self._result.stop_reason, self._result.stop_detail = reason, detail

    async def _step(self, method, arg, step: params.StepParams, phase_default: StopReason, timing: str, *,
                    extra_start_to_close_s: float = 0.0):
        started = workflow.now()
        try:
            return await workflow.execute_activity_method(
                method, arg, **step.options(extra_start_to_close_s=extra_start_to_close_s)
            )
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise asyncio.CancelledError() from err
            raise _stop_for(err, phase_default) from err
        finally:
            assert self._result is not None
            timings = self._result.timings
            timings[timing] = timings.get(timing, 0.0) + _seconds_since(started)

    async def _release(self, lease: SlotLease) -> None:
        """Release even while the workflow is being cancelled; a failed release is left to lease expiry."""
        release = asyncio.ensure_future(
            workflow.execute_activity_method(SlotActivities.release_slot, lease, **params.RELEASE_SLOT.options())
        )
        while not release.done():
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                continue
            except ActivityError as err:
                workflow.logger.warning("releasing slot %s failed: %s; its lease will expire", lease.slot, err)
                return


def _seconds_since(start: datetime) -> float:
    return round((workflow.now() - start).total_seconds(), 3)
