"""A rollout whose agent is a harness in the slot: each model call it makes is a model-turn step.

    start_harness                                   activity (its bundle put once per container)
    loop:
        call  = next_harness_call(sequence so far)  activity: the oldest unanswered request, held by the sandbox
        turn  = llm_turn(call's conversation)       activity, the same step as our own loop's turns
        answer_harness_call(turn's reply)           activity: the harness's request returns
    until the harness exits (then verify as usual) or a limit stops it (stop_harness, then verify)

The model turn is today's `llm_turn`, with its retries, timeouts, policy-version record,
context budget and transcript; `max_turns` counts the harness's calls and `max_tool_calls` the
tool calls its replies make. A call whose conversation extends the last one continues its
token sequence; one that rewrites it (or the first call of a restarted harness, after a
resume) begins a new one, counted in the trace's restarts and the record's rewrites.

A worker that dies costs the harness time only: its request stays held by the sandbox server,
the turn's result is in the history (so the model is not asked twice), and the answer step is
idempotent. A harness that exits with a failure status ends the rollout as `harness_failed`
(not scored: the harness broke, the model's attempt did not end); a resumed run starts the
harness again on the saved workspace.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.harness import (
        AnswerHarnessInput,
        HarnessActivities,
        NextHarnessCallInput,
        StartHarnessInput,
        StopHarnessInput,
    )
    from temporal_rollouts.core.harness import HarnessRecord, HarnessSpec
    from temporal_rollouts.core.records import Sampling, StopReason, TrajectoryInput, TrajectoryResult
    from temporal_rollouts.sandbox_server.schema import SlotRef
    from workflows import params
    from workflows.steps import StepFailed
    from workflows.turns import model_turn

Step = Callable[..., Awaitable[Any]]


class HarnessLoop:
    def __init__(self, step: Step, phase: Callable[[str], None]) -> None:
        self._step = step
        self._phase = phase

    async def run(self, input: TrajectoryInput, spec: HarnessSpec, slot: SlotRef, result: TrajectoryResult) -> None:
        """Run the harness until it exits or a limit stops it; sets the result's stop reason."""
        info = workflow.info()
        harness_id = f"{info.workflow_id}/{info.run_id}"
        record = result.harness = result.harness or HarnessRecord(spec=spec)
        self._phase("harness start")
        await self._step(
            HarnessActivities.start_harness,
            StartHarnessInput(
                lease=slot,
                harness_id=harness_id,
                spec=spec,
                env=input.env,
                env_config=input.env_config,
                item=input.item,
            ),
            params.START_HARNESS,
            StopReason.SANDBOX_ERROR,
            "harness",
        )
        record.starts += 1
        # The first call of this harness begins a sequence of its own: after a resume, the conversation so far
        # is an earlier harness's, which the new one cannot extend.
        sequence = None
        started = workflow.now()
        limits = input.limits
        while True:
            left = limits.wall_clock_s - _seconds_since(started)
            if left <= 0:
                return await self._stop(
                    slot, harness_id, result, StopReason.WALL_CLOCK, f"used the {limits.wall_clock_s:.0f}s budget"
                )
            self._phase(f"harness {record.calls}: waiting")
            waited = await self._step(
                HarnessActivities.next_harness_call,
                NextHarnessCallInput(
                    lease=slot, harness_id=harness_id, sequence=sequence, wait_s=min(left, params.HARNESS_WAIT_S)
                ),
                params.NEXT_HARNESS_CALL,
                StopReason.SANDBOX_ERROR,
                "harness",
            )
            if waited.exit is not None:
                record.exit = waited.exit
                if waited.exit.failed:
                    tail = (waited.exit.stderr_tail or waited.exit.stdout_tail).strip()[-300:]
                    raise StepFailed(
                        StopReason.HARNESS_FAILED, f"the harness exited with status {waited.exit.exit_code}: {tail}"
                    )
                result.stop_reason, result.stop_detail = StopReason.COMPLETED, "the harness exited with status 0"
                return None
            call = waited.call
            if call is None:
                continue
            if result.turns >= limits.max_turns:
                return await self._stop(
                    slot, harness_id, result, StopReason.MAX_TURNS, f"reached {limits.max_turns} turns"
                )
            if sequence is not None and not call.extends:
                record.rewrites += 1
            record.calls += 1
            self._phase(f"turn {result.turns + 1}")
            fresh = not call.extends and result.tokens is not None
            turn = await model_turn(
                self._step,
                input,
                slot,
                result,
                call.transcript,
                tokens=result.tokens if call.extends else None,
                sampling=_sampling(input.sampling, call.max_tokens),
                restarts=result.tokens.restarts + 1 if fresh and result.tokens else 0,
            )
            if isinstance(turn, StepFailed):
                return await self._stop(slot, harness_id, result, turn.reason, turn.detail)
            result.tool_calls += turn.calls
            sequence = turn.transcript
            if result.tool_calls > limits.max_tool_calls:
                return await self._stop(
                    slot, harness_id, result, StopReason.MAX_TOOL_CALLS, f"reached {limits.max_tool_calls} tool calls"
                )
            self._phase(f"turn {result.turns}: answer")
            await self._step(
                HarnessActivities.answer_harness_call,
                AnswerHarnessInput(
                    lease=slot,
                    harness_id=harness_id,
                    request_id=call.request_id,
                    assistant=turn.assistant,
                    finish_reason=turn.finish_reason,
                    prompt_tokens=turn.prompt_tokens,
                    completion_tokens=turn.completion_tokens,
                ),
                params.ANSWER_HARNESS_CALL,
                StopReason.SANDBOX_ERROR,
                "harness",
            )

    async def _stop(
        self, slot: SlotRef, harness_id: str, result: TrajectoryResult, reason: StopReason, detail: str
    ) -> None:
        """A limit of the rollout was reached: end the harness (the env then verifies the workspace as it is)."""
        result.stop_reason, result.stop_detail = reason, detail
        self._phase("harness stop")
        stopped = await self._step(
            HarnessActivities.stop_harness,
            StopHarnessInput(lease=slot, harness_id=harness_id),
            params.STOP_HARNESS,
            StopReason.SANDBOX_ERROR,
            "harness",
        )
        assert result.harness is not None
        result.harness.exit = stopped


def _sampling(rollout: Sampling, harness_cap: int | None) -> Sampling:
    """The rollout's sampling, the reply capped further where the harness asked for less."""
    if harness_cap is not None and (rollout.max_tokens is None or harness_cap < rollout.max_tokens):
        return rollout.model_copy(update={"max_tokens": harness_cap})
    return rollout


def _seconds_since(start: datetime) -> float:
    return (workflow.now() - start).total_seconds()
