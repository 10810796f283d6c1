"""A batch's start_rate as windows: never more rollouts a second than asked, a whole group at a time."""

from __future__ import annotations

import pytest

from workflows.batch import start_window


@pytest.mark.parametrize(
    ("rate", "group_size", "window_s", "groups"),
    [
        (100, 1, 1.0, 100),  # a second's worth of single rollouts, then a timer
        (10, 8, 1.0, 1),  # one group of 8 a second: 8 rollouts/s, under 10
        (16, 8, 1.0, 2),
        (0.5, 1, 2.0, 1),  # below one a second: one rollout every two seconds
        (3, 8, 8 / 3, 1),  # a group takes longer than a second's share: one group per 2.67 s
        (0.1, 4, 40.0, 1),
    ],
)
def test_windows(rate: float, group_size: int, window_s: float, groups: int) -> None:
    got_window, got_groups = start_window(rate, group_size)
    assert got_window == pytest.approx(window_s)
    assert got_groups == groups
    assert got_groups * group_size / got_window <= rate + 1e-9  # the rate is never exceeded
