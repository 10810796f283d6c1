"""Per-rollout tool statistics: how each tool-call outcome counts, and how a group adds them up."""

from __future__ import annotations

from activities.tools import ToolCallResult
from temporal_rollouts.core.records import ToolStats


def test_each_outcome_counts_where_the_original_counted_it() -> None:
    stats = ToolStats()
    for outcome in ("ok", "invalid", "error", "ok"):
        stats.record(outcome)
    assert stats.model_dump() == {"attempted": 4, "schema_valid": 3, "executed_ok": 2, "execution_errors": 1}
    assert ToolStats.total([stats, ToolStats(attempted=1, schema_valid=1, executed_ok=1)]).model_dump() == {
        "attempted": 5,
        "schema_valid": 4,
        "executed_ok": 3,
        "execution_errors": 1,
    }


def test_results_recorded_before_outcomes_existed_count_by_their_error() -> None:
    ref = None  # not looked at here
    plain = ToolCallResult.model_construct(transcript=ref, error=None, outcome=None)
    failed = ToolCallResult.model_construct(transcript=ref, error="timed out", outcome=None)
    assert (plain.counted_as(), failed.counted_as()) == ("ok", "error")
    assert ToolCallResult.model_construct(transcript=ref, error="bad", outcome="invalid").counted_as() == "invalid"
