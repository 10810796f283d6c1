"""One model turn of a rollout, as our loop and a harness's calls both take it: the step, and what it adds
to the rollout's result."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from activities.llm import LlmActivities, LlmTurnInput, LlmTurnResult
    from temporal_rollouts.core.records import Sampling, StopReason, TrajectoryInput, TrajectoryResult
    from temporal_rollouts.core.refs import TokenTraceRef, TranscriptRef
    from temporal_rollouts.sandbox_server.schema import SlotRef
    from workflows import params
    from workflows.steps import StepFailed

Step = Callable[..., Awaitable[Any]]
MODEL_ENDS = (StopReason.MALFORMED_REPLY, StopReason.CONTEXT_BUDGET)
"""A turn that fails so is the model's doing: the rollout stops with it and is scored."""


async def model_turn(
    step: Step,
    input: TrajectoryInput,
    slot: SlotRef,
    result: TrajectoryResult,
    transcript: TranscriptRef,
    *,
    tokens: TokenTraceRef | None,
    sampling: Sampling,
    restarts: int = 0,
) -> LlmTurnResult | StepFailed:
    """Run the turn and count it in `result`; a failure the model caused comes back (the caller stops with it),
    any other is raised."""
    try:
        turn = await step(
            LlmActivities.llm_turn,
            LlmTurnInput(
                policy=input.policy,
                lease=slot,
                transcript=transcript,
                sampling=None if sampling == Sampling() else sampling,
                context_tokens=input.limits.context_tokens,
                tokens=tokens,
                restarts=restarts,
                tool_call_parser=input.tool_call_parser,
            ),
            params.LLM_TURN,
            StopReason.MODEL_UNAVAILABLE,
            "llm",
        )
    except StepFailed as failed:
        if failed.reason in MODEL_ENDS:
            return failed
        raise
    result.turns += 1
    result.transcript, result.tokens = turn.transcript, turn.tokens
    result.policy_versions.append(turn.policy_version)
    result.completion_tokens += turn.completion_tokens or 0
    return turn
