"""The trainer's view the feed's admission reads: which served versions count as a batch still in training."""

from __future__ import annotations

import pytest

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
