"""How a batch's rollouts are filtered (the visibility query) and reduced to the page's figures."""

from __future__ import annotations

import pytest

from temporal_rollouts.client.records import natural_key
from temporal_rollouts.client.rollout_rows import (
    RolloutFilter,
    RolloutOutcome,
    RolloutRow,
    rollouts_query,
)
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.view.figures import histogram, stop_reason_bars, time_shares


def test_a_score_range_asks_for_scored_rollouts_only() -> None:
    query = rollouts_query("b-1", RolloutFilter(min_score=0, max_score=0.25))
    assert query == (
        "(RolloutBatchId = 'b-1' OR RolloutForkedFrom STARTS_WITH 'b-1/') AND WorkflowType = 'TrajectoryWorkflow' "
        "AND ExecutionStatus = 'Completed' "
        "AND RolloutScore >= 0 AND RolloutScore <= 0.25"
    )
    assert "RolloutScore >= 0.00001" in rollouts_query("b", RolloutFilter(min_score=1e-5))


@pytest.mark.parametrize(
    "wanted", [RolloutFilter(status="done"), RolloutFilter(stop_reason="bored"), RolloutFilter(min_score=float("nan"))]
)
def test_unknown_filter_values_are_refused(wanted: RolloutFilter) -> None:
    with pytest.raises(ConfigError):
        rollouts_query("b", wanted)


def test_rollout_ids_sort_naturally() -> None:
    ids = ["b/item-10/g0", "b/item-2/g1", "b/item-2/g0", "b/item-100/g0", "b/item-1/g0"]
    assert sorted(ids, key=natural_key) == [
        "b/item-1/g0",
        "b/item-2/g0",
        "b/item-2/g1",
        "b/item-10/g0",
        "b/item-100/g0",
    ]


def test_few_distinct_scores_get_a_bar_each_and_many_get_bins() -> None:
    bars = histogram([1.0] * 998 + [0.0, 0.0])
    assert [(b.label, b.count, b.low, b.high) for b in bars] == [("0", 2, 0.0, 0.0), ("1", 998, 1.0, 1.0)]
    spread = histogram([i / 100 for i in range(101)])
    assert len(spread) == 10 and sum(b.count for b in spread) == 101
    assert spread[0].low == 0.0 and spread[-1].high == pytest.approx(1.0)


def test_stop_reasons_tell_scored_from_failed_and_skip_running_rollouts() -> None:
    rows = [
        RolloutRow(rollout_id=f"b/item-{i}/g0", run_id=str(i), status=status, stop_reason=reason)
        for i, (status, reason) in enumerate(
            [("completed", "completed"), ("completed", "completed"), ("failed", "model_rejected"), ("running", None)]
        )
    ]
    assert [(b.label, b.count, b.scored) for b in stop_reason_bars(rows)] == [
        ("completed", 2, True),
        ("model_rejected", 1, False),
    ]


def test_time_is_shared_out_by_phase_and_the_rest_is_other() -> None:
    outcomes = [
        RolloutOutcome(turns=3, tool_calls=2, timings={"acquire": 1, "llm": 6, "tools": 2, "total": 10}),
        RolloutOutcome(turns=1, tool_calls=0, timings={"acquire": 1, "llm": 2, "total": 4}),
    ]
    shares = {p.phase: (p.seconds, p.mean_s, p.share) for p in time_shares(outcomes)}
    assert shares == {
        "acquire": (2, 1, pytest.approx(2 / 14, abs=1e-4)),
        "model": (8, 4, pytest.approx(8 / 14, abs=1e-4)),
        "tools": (2, 1, pytest.approx(2 / 14, abs=1e-4)),
        "other": (2, 1, pytest.approx(2 / 14, abs=1e-4)),
    }
