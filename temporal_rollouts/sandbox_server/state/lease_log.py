"""The lease event log of one sandbox server (`leases.jsonl` under its root), and what it tells.

The server is the authority for its slots, so it is also the one place that can say
exactly when a slot was granted, given back, or handed straight to a waiter. Each
event carries the line length and the free slot count after it, so a reader can
rebuild both over time without knowing anything else: tests and benchmarks use
that to measure hand-over latency, utilisation and time lost with a slot free while
someone waited. The file is rotated once (to `leases.jsonl.1`) when it grows large,
so a long-running server cannot fill the disk with it.
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Iterable
from pathlib import Path

from pydantic import ValidationError

from temporal_rollouts.sandbox_server.schema import LeaseEvent

log = logging.getLogger(__name__)

LOG_NAME = "leases.jsonl"
MAX_LOG_BYTES = 64_000_000
ENDINGS = ("released", "expired", "reaped")


class LeaseLog:
    """Appends events; an event that cannot be written is logged and dropped, never raised:
    losing a line of statistics must not fail a lease operation."""

    def __init__(self, root: Path, max_bytes: int = MAX_LOG_BYTES) -> None:
        self.path = root / LOG_NAME
        self.max_bytes = max_bytes

    def record(self, event: LeaseEvent) -> None:
        try:
            if self.path.exists() and self.path.stat().st_size > self.max_bytes:
                os.replace(self.path, self.path.with_name(LOG_NAME + ".1"))
            with self.path.open("a", encoding="utf-8") as file:
                file.write(event.model_dump_json(exclude_none=True) + "\n")
        except OSError as err:
            log.warning("cannot write lease event to %s: %s", self.path, err)


def read_lease_events(root: Path) -> list[LeaseEvent]:
    """Every readable event under a server root (rotated file first), sorted by time.

    Sorting matters: a release is written once its slot was reset and handed on (so
    that `handed_over` is known), but carries the time the lease ended."""
    events: list[LeaseEvent] = []
    for path in (root / (LOG_NAME + ".1"), root / LOG_NAME):
        try:
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
        except FileNotFoundError:
            continue
        for line in lines:
            try:
                events.append(LeaseEvent.model_validate_json(line))
            except ValidationError:
                continue
    return sorted(events, key=lambda event: event.t)


def lease_spans(events: Iterable[LeaseEvent]) -> dict[str, tuple[float, float]]:
    """lease_id -> (granted, ended); -inf when the grant is not in the log (an earlier file or
    process), +inf while the lease is still held."""
    spans: dict[str, tuple[float, float]] = {}
    for event in events:
        if event.lease_id is None:
            continue
        start, end = spans.get(event.lease_id, (-math.inf, math.inf))
        if event.event == "granted" and start == -math.inf:
            spans[event.lease_id] = (event.t, end)
        elif event.event in ENDINGS:
            spans[event.lease_id] = (start, min(end, event.t))
    return spans


def utilisation(events: Iterable[LeaseEvent], slots: int, start: float, end: float) -> float:
    """Busy slot-seconds / (slots * (end - start)): the share of slot time spent leased."""
    if slots < 1 or end <= start:
        raise ValueError("utilisation needs at least one slot and end after start")
    busy = sum(max(0.0, min(ended, end) - max(granted, start)) for granted, ended in lease_spans(events).values())
    return busy / (slots * (end - start))


def idle_while_waiting(events: Iterable[LeaseEvent]) -> float:
    """Seconds during which some slot had no lease while some request waited in line.

    Pass the events of one server: line and free counts are per server. Time a slot
    spends being reset for its next holder counts, as nobody works in it."""
    ordered = sorted(events, key=lambda event: event.t)
    return sum(later.t - event.t for event, later in zip(ordered, ordered[1:]) if event.free > 0 and event.waiters > 0)


def hand_over_latencies(events: Iterable[LeaseEvent]) -> list[float]:
    """For every lease that ended with its slot handed straight to a waiter, the seconds
    until that slot's next grant (the reset of the workspace included)."""
    ordered = sorted(events, key=lambda event: event.t)
    latencies = []
    for index, event in enumerate(ordered):
        if event.event in ENDINGS and event.handed_over:
            grant = next((g for g in ordered[index + 1 :] if g.event == "granted" and g.slot == event.slot), None)
            if grant is not None:
                latencies.append(grant.t - event.t)
    return latencies
