"""What a workflow that starts rollouts as children needs: a failed child's result, and its search attributes.

Shared by the batch, the rollout tree and the training feed, so a rollout reads the same
in the UI and counts the same in a group whoever started it.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ApplicationError, CancelledError, ChildWorkflowError, TerminatedError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from temporal_rollouts.core import search_attributes as sa
    from temporal_rollouts.core.errors import stop_reason_of
    from temporal_rollouts.core.records import StopReason, TrajectoryInput, TrajectoryResult, failed_rollout_result
    from temporal_rollouts.core.tasks import Item


def result_from_failure(
    err: ChildWorkflowError, rollout: str, env: str, item: Item, group_index: int
) -> TrajectoryResult:
    """A failed child's TrajectoryResult: carried in its failure, or rebuilt from how it ended."""
    cause = err.cause
    if (carried := failed_rollout_result(cause)) is not None:
        return carried
    if isinstance(cause, TerminatedError):
        reason = StopReason.TERMINATED
    elif isinstance(cause, CancelledError):
        reason = StopReason.CANCELLED
    elif isinstance(cause, TimeoutError):
        reason = StopReason.TIMED_OUT
    elif isinstance(cause, ApplicationError) and (declared := stop_reason_of(cause.type or "")):
        reason = StopReason(declared)  # e.g. a rollout refused its input: config_error
    else:
        reason = StopReason.ENV_ERROR
    return TrajectoryResult(
        rollout_id=rollout,
        env=env,
        item_id=item.id,
        group_index=group_index,
        stop_reason=reason,
        stop_detail=str(cause or err),
    )


def rollout_attributes(input: TrajectoryInput) -> TypedSearchAttributes:
    """Env, batch and item of a rollout, and for a fork the rollout and turn it was forked from."""
    pairs = [SearchAttributePair(sa.ENV, input.env), SearchAttributePair(sa.ITEM_ID, input.item.id)]
    if input.batch_id:
        pairs.append(SearchAttributePair(sa.BATCH_ID, input.batch_id))
    if input.fork:
        pairs += [
            SearchAttributePair(sa.FORKED_FROM, input.fork.source),
            SearchAttributePair(sa.FORK_TURN, input.fork.at_turn),
        ]
    return TypedSearchAttributes(pairs)
