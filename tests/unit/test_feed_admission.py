"""The trainer's view the feed's admission reads: which served versions count as a batch still in training,
and what ends a wait for the trainer."""

from __future__ import annotations

import pytest

from activities.feed import TrainerQuery, trainer_moved
from temporal_rollouts.core.feed import TrainerView


def view(step: int, version: int | None) -> TrainerView:
    return TrainerView(current_step=step, policy_version=version)


@pytest.mark.parametrize(
    ("step", "version", "ahead"),
    [
        (5, 4, 1),  # run-api handed out batch 5, the server still serves 4: one batch in training
        (5, 5, 0),  # trained and served
        (5, 6, 0),  # a version ahead of run-api (a restarted run-api): nothing in training
        (9, 6, 0),  # weights published every few steps: not a clock admission may wait on
        (5, None, 0),  # no numeric version: run-api's step alone
        (0, None, 0),
    ],
)
def test_a_batch_counts_as_in_training_only_when_the_served_version_is_one_behind(step, version, ahead) -> None:
    assert view(step, version).batches_ahead() == ahead


@pytest.mark.parametrize(
    ("seen", "moved"),
    [
        (TrainerView(current_step=3, env_id=0, policy_version=3), False),  # still at the step it waits past
        (TrainerView(current_step=4, env_id=0, policy_version=3), True),  # the trainer stepped
        (TrainerView(current_step=3, env_id=0, policy_version=4), True),  # new weights served
        (TrainerView(current_step=0, env_id=0), True),  # run-api restarted: its step went back
        (TrainerView(current_step=3, env_id=1, policy_version=3), True),  # the run registered again
        (TrainerView(current_step=3, policy_version=3), True),  # a run-api that lost the run and its trainer
    ],
)
def test_a_wait_for_the_trainer_ends_when_it_steps_or_run_api_restarted(seen: TrainerView, moved: bool) -> None:
    query = TrainerQuery(run="r", env_id=0, after_step=3, after_version=3)
    assert trainer_moved(query, seen) is moved
    assert trainer_moved(query.model_copy(update={"after_step": None}), seen), "no step to wait past: at once"
