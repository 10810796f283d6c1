"""The trainer door's ledger on its own: numbering, leases, re-delivery, idempotent acknowledgement,
and staleness decided when a batch is formed (groups finishing out of order against a slow trainer)."""

from __future__ import annotations

import pytest

from temporal_rollouts.core.door import (
    AckRequest,
    DoorError,
    DoorGroup,
    DoorLedger,
    RegisterRequest,
    ReleaseRequest,
    StaleGroups,
    TakeRequest,
    TakeRules,
)
from temporal_rollouts.core.tasks import Item


def group(n: int, versions: list[int | None], started: int = 0, size: int = 2) -> DoorGroup:
    return DoorGroup(
        group_id=f"run/g{n}",
        key=f"feeds/run/groups/g{n}.json",
        item=Item(id=f"item-{n}"),
        sequences=size,
        tokens=10 * size,
        completion_tokens=12 * size,
        versions=[list(versions) for _ in range(size)],
        started_step=started,
    )


def rules(per_batch: int = 2, max_staleness: int = 1, stale: StaleGroups = StaleGroups.POST, final=False):
    return TakeRules(per_batch=per_batch, max_staleness=max_staleness, stale_groups=stale, max_requeues=2, final=final)


def ledger(*groups: DoorGroup, batch_size: int = 4) -> DoorLedger:
    door = DoorLedger()
    door.register(RegisterRequest(batch_size=batch_size))
    door.pending.extend(groups)
    return door


def test_batches_are_numbered_and_an_acknowledged_one_is_never_handed_out_again() -> None:
    door = ledger(*(group(n, [0]) for n in range(4)))
    first = door.take(TakeRequest(lease_s=10), now=0, rules=rules()).batch
    second = door.take(TakeRequest(lease_s=10), now=1, rules=rules()).batch
    assert first and second and (first.number, second.number) == (0, 1)
    assert [g.group.group_id for g in first.groups] == ["run/g0", "run/g1"]
    assert door.take(TakeRequest(), now=2, rules=rules()).batch is None, "nothing left"

    assert door.acknowledge(AckRequest(number=1, lease=second.lease)).status == "acknowledged"
    assert door.acknowledged_below == 0, "batch 0 is still out"
    assert door.acknowledge(AckRequest(number=0, lease=first.lease)).acknowledged_below == 2
    again = door.acknowledge(AckRequest(number=0, lease=first.lease))
    assert again.status == "already_acknowledged" and door.figures.acks_repeated == 1
    assert door.figures.batches_acknowledged == 2 and door.figures.tokens_acknowledged == 80
    assert door.take(TakeRequest(), now=100, rules=rules()).batch is None, "acknowledged: never again"
    assert door.trainer_version() == 2 and door.is_empty()


def test_a_lease_that_runs_out_hands_the_same_batch_out_again_and_counts_it() -> None:
    door = ledger(group(0, [0]), group(1, [0]))
    taken = door.take(TakeRequest(lease_s=10), now=0, rules=rules()).batch
    assert taken is not None
    assert not door.may_take(TakeRequest(), 5, rules()), "leased, nothing else stored"
    assert door.may_take(TakeRequest(), 10, rules())
    again = door.take(TakeRequest(lease_s=10, consumer="restarted"), now=10, rules=rules()).batch
    assert again is not None and (again.number, again.deliveries) == (0, 2)
    assert [g.group.group_id for g in again.groups] == [g.group.group_id for g in taken.groups]
    assert (door.figures.leases_expired, door.figures.batches_redelivered, door.figures.batches_taken) == (1, 1, 2)
    # the first taker trained it anyway and acknowledges late: the batch counts once, and is not handed out again
    assert door.acknowledge(AckRequest(number=0, lease=taken.lease)).status == "acknowledged"
    assert door.acknowledge(AckRequest(number=0, lease=again.lease)).status == "already_acknowledged"
    assert door.figures.groups_acknowledged == 2 and door.is_empty()


def test_a_released_batch_is_handed_out_at_once_and_a_wrong_lease_is_refused() -> None:
    door = ledger(group(0, [0]), group(1, [0]))
    taken = door.take(TakeRequest(), now=0, rules=rules()).batch
    assert taken is not None
    with pytest.raises(DoorError, match="not one of batch 0"):
        door.acknowledge(AckRequest(number=0, lease="0.7"))
    with pytest.raises(DoorError, match="no batch 3"):
        door.acknowledge(AckRequest(number=3, lease="3.1"))
    door.release(ReleaseRequest(number=0, lease=taken.lease))
    again = door.take(TakeRequest(), now=1, rules=rules()).batch
    assert again is not None and again.number == 0 and door.figures.batches_released == 1


def test_the_previous_batch_is_acknowledged_by_the_next_take_where_a_trainer_has_no_ack() -> None:
    door = ledger(*(group(n, [0]) for n in range(3)))
    atropos = TakeRequest(consumer="atropos", ack_previous=True)
    door.take(atropos, now=0, rules=rules())
    assert not door.may_take(TakeRequest(consumer="other"), 1, rules()), "one group: no full batch"
    assert door.may_take(atropos, 1, rules()), "the ask itself acknowledges batch 0, so it is heard"
    answer = door.take(atropos, now=1, rules=rules())
    assert answer.batch is None and answer.acknowledged_below == 1 and door.trainer_version() == 1
    assert not door.may_take(atropos, 2, rules())


def test_groups_that_finish_out_of_order_never_reach_a_slow_trainer_staler_than_the_bound() -> None:
    """Group 0 started on version 0 and finished last; groups 1-4 started later and finished first. The
    trainer is slow: it takes a batch only after acknowledging two. Every group it trains is within the
    bound; the late one is handed over marked (post), masked (scores_only), dropped or started again."""
    for stale in StaleGroups:
        door = ledger(group(1, [1]), group(2, [1]), group(3, [2]), group(4, [2]), batch_size=4)
        door.starting_step = 2  # the trainer acknowledged two batches before this point
        door.pending.append(group(0, [0, 1]))  # the slow one ends now
        answer = door.take(TakeRequest(), now=0, rules=rules(stale=stale))
        batch = answer.batch
        assert batch is not None and batch.trainer_version == 2
        by_id = {g.group.group_id: g for g in batch.groups}
        assert all(g.staleness <= 1 for g in batch.groups if not g.stale), stale
        if stale in (StaleGroups.POST, StaleGroups.SCORES_ONLY):
            late = by_id["run/g0"]
            assert late.stale and late.staleness == 2, "oldest first, and marked"
            assert late.masked == ([0, 1] if stale == StaleGroups.SCORES_ONLY else [])
            assert door.figures.groups_marked_stale == 1 and door.figures.staleness == {"2": 1, "1": 1}
        else:
            assert "run/g0" not in by_id and set(by_id) == {"run/g1", "run/g2"}
            assert all(g.staleness == 1 for g in batch.groups)
        if stale == StaleGroups.REQUEUE:
            assert [g.group_id for g in answer.requeue] == ["run/g0"] and door.figures.groups_requeued == 1
        if stale == StaleGroups.DROP:
            assert door.figures.groups_dropped_stale == 1 and answer.requeue == []


def test_a_batch_handed_out_again_after_the_trainer_moved_on_is_never_trained_past_the_bound() -> None:
    """Batch 0 (groups of version 0, one step stale) is taken at version 1 and its trainer dies. A trainer
    takes batch 1, trains it and acknowledges: it trains version 2 now. When batch 0's lease ends it goes
    out again, the same number and groups, but two steps stale: decided again against version 2, as the
    run's policy says (marked, masked, or held back whole with its item started again)."""
    for stale in StaleGroups:
        door = ledger(group(0, [0]), group(1, [0]), group(2, [1]), group(3, [1]), batch_size=4)
        door.starting_step = 1
        first = door.take(TakeRequest(lease_s=10), now=0, rules=rules(stale=stale)).batch
        assert first is not None and [g.staleness for g in first.groups] == [1, 1]
        second = door.take(TakeRequest(lease_s=10), now=1, rules=rules(stale=stale)).batch
        assert second is not None and second.number == 1
        door.acknowledge(AckRequest(number=1, lease=second.lease))
        assert door.trainer_version() == 2

        answer = door.take(TakeRequest(lease_s=10), now=20, rules=rules(stale=stale))
        again = answer.batch
        assert again is not None and (again.number, again.deliveries, again.trainer_version) == (0, 2, 2), stale
        assert [g.group.group_id for g in again.groups] == ["run/g0", "run/g1"], "the same batch, whole"
        assert all(g.stale and g.staleness == 2 for g in again.groups), stale
        f = door.figures
        held_back = stale in (StaleGroups.DROP, StaleGroups.REQUEUE)
        assert f.staleness == ({"0": 2} if held_back else {"2": 2, "0": 2}), "at consumption: batch 1 at 0, 0 at 2"
        assert all(g.held_back == held_back for g in again.groups)
        if stale == StaleGroups.POST:
            assert all(g.masked == [] for g in again.groups) and f.groups_marked_stale == 2
        else:  # not one of its tokens is trained
            assert all(g.masked == [0, 1] for g in again.groups), stale
        if held_back:
            assert f.completion_tokens_held_back == 2 * 24
            door.acknowledge(AckRequest(number=0, lease=again.lease))
            assert (f.groups_acknowledged, f.completion_tokens_acknowledged) == (2, 2 * 24), "held back, not trained"
        if stale == StaleGroups.REQUEUE:
            assert [g.group_id for g in answer.requeue] == ["run/g0", "run/g1"] and f.groups_requeued == 2
        if stale == StaleGroups.DROP:
            assert answer.requeue == [] and f.groups_dropped_stale == 2


def test_a_group_requeued_too_often_is_dropped() -> None:
    late = group(0, [0]).model_copy(update={"requeues": 2})
    door = ledger(late, group(1, [5]), group(2, [5]))
    door.starting_step = 5
    answer = door.take(TakeRequest(), now=0, rules=rules(stale=StaleGroups.REQUEUE))
    assert answer.requeue == [] and door.figures.groups_dropped_stale == 1
    assert answer.batch is not None and [g.group.group_id for g in answer.batch.groups] == ["run/g1", "run/g2"]


def test_a_group_without_version_labels_is_as_old_as_the_trainer_was_when_it_started() -> None:
    door = ledger(group(0, [None], started=0), group(1, [None], started=3))
    answer = door.take(TakeRequest(trainer_version=3), now=0, rules=rules(stale=StaleGroups.POST))
    assert answer.batch is not None
    assert [(g.staleness, g.stale) for g in answer.batch.groups] == [(3, True), (0, False)]


def test_the_last_groups_go_out_as_a_short_batch_only_when_nothing_more_is_coming() -> None:
    door = ledger(group(0, [0]))
    assert not door.may_take(TakeRequest(), 0, rules()) and door.take(TakeRequest(), now=0, rules=rules()).batch is None
    assert door.may_take(TakeRequest(), 0, rules(final=True))
    last = door.take(TakeRequest(), now=0, rules=rules(final=True)).batch
    assert last is not None and last.final and len(last.groups) == 1


def test_a_second_trainer_with_another_batch_size_is_refused() -> None:
    door = ledger(batch_size=4)
    with pytest.raises(DoorError, match="4 sequences"):
        door.register(RegisterRequest(batch_size=8))
    door.register(RegisterRequest(batch_size=4, starting_step=9))
    assert door.trainer_version() == 9


def test_a_turn_is_labelled_only_with_what_the_server_reported() -> None:
    """The weights a server started with are version 0; a name that is not a number is unknown, never a guess."""
    from activities.llm import numeric_version

    assert [numeric_version(v) for v in ("default", "0", "7", None, "step-3")] == [0, 0, 7, None, None]
