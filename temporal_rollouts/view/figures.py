"""A batch's figures, reduced here to what the page's charts draw.

The page draws bars, not rows: the score distribution, the stop reasons, the turns per
rollout and where the rollouts' time went (acquire, setup, model, tools, verify, from each
closed run's `timings`). Reducing a thousand rollouts to a few dozen numbers on the server
keeps the page light and its refresh cheap.
"""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel

from temporal_rollouts.client.rollout_rows import RolloutOutcome, RolloutRow
from temporal_rollouts.core.records import StopReason

MAX_BARS = 12
"""A histogram shows each distinct value while there are at most this many; else equal-width bins."""
BINS = 10
PHASES = {
    "acquire": "acquire",
    "setup": "setup",
    "llm": "model",
    "tools": "tools",
    "verify": "verify",
    "resume": "resume",
}
"""Timing keys of a TrajectoryResult and the names the page gives them; the rest of `total` is `other`."""


class Bar(BaseModel):
    label: str
    count: int
    low: float | None = None
    high: float | None = None
    scored: bool | None = None


class PhaseTime(BaseModel):
    phase: str
    seconds: float
    mean_s: float
    share: float


class Counts(BaseModel):
    total: int | None = None
    completed: int = 0
    failed: int = 0
    running: int = 0
    queued: int = 0


class Figures(BaseModel):
    batch_id: str
    kind: str
    status: str
    counts: Counts
    scores: list[Bar]
    stop_reasons: list[Bar]
    turns: list[Bar]
    time: list[PhaseTime]
    outcomes_read: int
    outcomes_pending: int
    feed: dict | None = None
    feed_error: str | None = None
    retrying: list[str] = []
    """While it runs: what its steps retry and why, one line per cause."""


def _label(value: float) -> str:
    return f"{value:g}" if value == int(value) or abs(value) >= 0.01 else f"{value:.2g}"


def histogram(values: list[float]) -> list[Bar]:
    if not values:
        return []
    counted = Counter(values)
    if len(counted) <= MAX_BARS:
        return [Bar(label=_label(v), count=n, low=v, high=v) for v, n in sorted(counted.items())]
    low, high = min(values), max(values)
    width = (high - low) / BINS
    bins = [0] * BINS
    for value in values:
        bins[min(int((value - low) / width), BINS - 1)] += 1
    edges = [low + i * width for i in range(BINS + 1)]
    return [
        Bar(label=f"{_label(edges[i])}–{_label(edges[i + 1])}", count=bins[i], low=edges[i], high=edges[i + 1])
        for i in range(BINS)
    ]


def stop_reason_bars(rows: list[RolloutRow]) -> list[Bar]:
    counted = Counter(row.stop_reason for row in rows if row.stop_reason and row.status != "running")
    scored = {reason.value for reason in StopReason if reason.scored}
    return [Bar(label=reason, count=n, scored=reason in scored) for reason, n in counted.most_common()]


def time_shares(outcomes: list[RolloutOutcome]) -> list[PhaseTime]:
    if not outcomes:
        return []
    spent: Counter[str] = Counter()
    for outcome in outcomes:
        phases = {PHASES[key]: seconds for key, seconds in outcome.timings.items() if key in PHASES}
        spent.update(phases)
        spent["other"] += max(outcome.timings.get("total", 0.0) - sum(phases.values()), 0.0)
    total = sum(spent.values()) or 1.0
    order = [*PHASES.values(), "other"]
    return [
        PhaseTime(
            phase=phase,
            seconds=round(spent[phase], 3),
            mean_s=round(spent[phase] / len(outcomes), 3),
            share=round(spent[phase] / total, 4),
        )
        for phase in order
        if spent.get(phase)
    ]


def batch_figures(
    batch_id: str,
    kind: str,
    status: str,
    counts: Counts,
    rows: list[RolloutRow],
    outcomes: dict[str, RolloutOutcome],
    pending: int,
) -> Figures:
    return Figures(
        batch_id=batch_id,
        kind=kind,
        status=status,
        counts=counts,
        scores=histogram([row.score for row in rows if row.score is not None]),
        stop_reasons=stop_reason_bars(rows),
        turns=histogram([float(outcome.turns) for outcome in outcomes.values()]),
        time=time_shares(list(outcomes.values())),
        outcomes_read=len(outcomes),
        outcomes_pending=pending,
    )


def counts_of_rows(rows: list[RolloutRow], total: int | None = None) -> Counts:
    """Counts from the rows themselves (a training run has no fixed total)."""
    by_status = Counter(row.status for row in rows)
    running = by_status["running"]
    completed = by_status["completed"]
    failed = len(rows) - running - completed
    queued = max((total or 0) - len(rows), 0)
    return Counts(
        total=total if total is not None else len(rows),
        completed=completed,
        failed=failed,
        running=running,
        queued=queued,
    )
