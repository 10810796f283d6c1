"""The lease event log's reader and measures, on events written by hand with known answers."""

from __future__ import annotations

import math

import pytest

from temporal_rollouts.sandbox_server.state.lease_log import (
    LeaseLog,
    hand_over_latencies,
    idle_while_waiting,
    lease_spans,
    read_lease_events,
    utilisation,
)
from temporal_rollouts.sandbox_server.schema import Holder, LeaseEvent


def event(t: float, kind: str, slot: int | None, lease: str | None, waiters: int, free: int, **more) -> LeaseEvent:
    holder = Holder(workflow_id=lease or "waiter")
    return LeaseEvent(t=t, event=kind, slot=slot, lease_id=lease, holder=holder, waiters=waiters, free=free, **more)


# Two slots, watched from t=100 to t=120. Slot 0: lease a from 100 to 110, then handed to b, granted at 111
# (the reset took 1s), held to the end. Slot 1: lease c, granted before the log starts, expires at 105.
# b's request queues at 108 (as if slot 1 were not offered to it), so a slot is free while it waits: 108-111.
EVENTS = [
    event(100.0, "granted", 0, "a", waiters=0, free=1),
    event(105.0, "expired", 1, "c", waiters=0, free=2),
    event(108.0, "queued", None, None, waiters=1, free=1),
    event(110.0, "released", 0, "a", waiters=1, free=2, handed_over=True),
    event(111.0, "granted", 0, "b", waiters=0, free=1),
]


def test_spans_pair_grants_with_their_ends():
    spans = lease_spans(EVENTS)
    assert spans == {"a": (100.0, 110.0), "c": (-math.inf, 105.0), "b": (111.0, math.inf)}


def test_utilisation_counts_leased_slot_seconds_inside_the_window():
    busy = (110 - 100) + (105 - 100) + (120 - 111)
    assert utilisation(EVENTS, slots=2, start=100.0, end=120.0) == pytest.approx(busy / 40)
    assert utilisation(EVENTS, slots=2, start=112.0, end=114.0) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        utilisation(EVENTS, slots=0, start=0.0, end=1.0)


def test_idle_while_waiting_and_hand_over_latency():
    assert idle_while_waiting(EVENTS) == pytest.approx(111.0 - 108.0)
    assert hand_over_latencies(EVENTS) == [pytest.approx(1.0)]


def test_the_log_is_read_back_in_time_order_across_its_rotation(tmp_path):
    log = LeaseLog(tmp_path, max_bytes=200)
    for item in reversed(EVENTS):
        log.record(item)
    with (tmp_path / "leases.jsonl").open("a") as file:
        file.write("not json\n")
    read = read_lease_events(tmp_path)
    assert (tmp_path / "leases.jsonl.1").exists()
    assert [e.t for e in read] == sorted(e.t for e in read) and len(read) >= 3
