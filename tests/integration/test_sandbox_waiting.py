"""Waiting for a slot on one real sandbox server: clients that leave, tickets, and the lease event log."""

from __future__ import annotations

import asyncio
import signal
import time

import pytest

from temporal_rollouts.core.errors import SlotUnavailable
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.requests import HealthQuery, SlotsQuery
from temporal_rollouts.sandbox_server.http.app import _acquire_while_connected
from temporal_rollouts.sandbox_server.state.lease_log import (
    hand_over_latencies,
    idle_while_waiting,
    read_lease_events,
    utilisation,
)
from temporal_rollouts.sandbox_server.schema import AcquireRequest, WithdrawRequest
from temporal_rollouts.sandbox_server.config import ContainerConfig
from temporal_rollouts.sandbox_server.slots.manager import SlotManager
from tests.support.sandbox import (
    eventually,
    holder,
    release_of,
    root_of,
    running_container,
    sandbox_settings,
    spawn_waiting_client,
)


@pytest.fixture
async def one_slot(tmp_path):
    backend = LocalBackend(tmp_path / "data", sandbox_settings(slots_per_container=1, sweep_interval_s=0.3))
    async with running_container(backend) as (info, client):
        yield backend, info, client


async def waiters(client) -> int:
    return (await client.send(HealthQuery())).waiters


async def test_a_client_killed_while_waiting_leaves_the_line_and_gets_no_slot(one_slot):
    backend, info, client = one_slot
    first = await client.send(AcquireRequest(holder=holder("first"), ttl_s=60, wait_s=0))
    dead = spawn_waiting_client(info, "dead-worker")
    try:
        assert await eventually(lambda: _equals(waiters(client), 1), timeout_s=10)
        patient = holder("patient")
        waiting = asyncio.create_task(client.send(AcquireRequest(holder=patient, ttl_s=60, wait_s=10)))
        assert await eventually(lambda: _equals(waiters(client), 2))
        dead.send_signal(signal.SIGKILL)
        dead.wait(5)
        assert await eventually(lambda: _equals(waiters(client), 1))
    finally:
        dead.kill()
    await client.send(release_of(first))
    granted = await asyncio.wait_for(waiting, 2)
    leases = [state.lease for state in await client.send(SlotsQuery())]
    events = read_lease_events(root_of(backend, info.container_id))
    assert granted.holder == patient and [lease.holder for lease in leases if lease] == [patient]
    left = [e for e in events if e.holder and e.holder.workflow_id == "dead-worker"]
    assert [(e.event, e.reason) for e in left] == [("queued", None), ("withdrawn", "disconnected")]
    await client.send(release_of(granted))


async def test_a_cancelled_request_leaves_the_line(one_slot):
    _, _, client = one_slot
    first = await client.send(AcquireRequest(holder=holder("first"), ttl_s=60, wait_s=0))
    impatient = asyncio.create_task(client.send(AcquireRequest(holder=holder("impatient"), ttl_s=60, wait_s=30)))
    assert await eventually(lambda: _equals(waiters(client), 1))
    impatient.cancel()
    assert await eventually(lambda: _equals(waiters(client), 0))
    await client.send(release_of(first))
    assert await eventually(lambda: _free(client))


async def test_withdraw_takes_a_ticket_out_of_line_even_before_it_arrives(one_slot):
    _, _, client = one_slot
    first = await client.send(AcquireRequest(holder=holder("first"), ttl_s=60, wait_s=0))
    ticketed = AcquireRequest(holder=holder("ticketed"), ttl_s=60, wait_s=30, ticket="t-1")
    waiting = asyncio.create_task(client.send(ticketed))
    assert await eventually(lambda: _equals(waiters(client), 1))
    started = time.monotonic()
    assert (await client.send(WithdrawRequest(ticket="t-1"))).withdrawn
    with pytest.raises(SlotUnavailable, match="withdrawn"):
        await waiting
    assert time.monotonic() - started < 1.0
    assert (await client.send(WithdrawRequest(ticket="t-1"))).withdrawn is False
    assert (await client.send(WithdrawRequest(ticket="t-early"))).withdrawn is False
    started = time.monotonic()
    with pytest.raises(SlotUnavailable, match="withdrawn before it arrived"):
        await client.send(AcquireRequest(holder=holder("late"), ttl_s=60, wait_s=30, ticket="t-early"))
    assert time.monotonic() - started < 1.0 and await waiters(client) == 0
    await client.send(release_of(first))


async def test_a_slot_granted_as_the_client_leaves_is_given_back(tmp_path):
    """The grant and the disconnect race: whichever the server sees first, the slot ends up free."""

    class Gone:
        async def receive(self) -> dict:
            return {"type": "http.disconnect"}

    async with SlotManager(ContainerConfig(root=tmp_path / "root", slots_per_container=1, container_id="c")) as manager:
        body = AcquireRequest(holder=holder("vanishing"), ttl_s=60, wait_s=5)
        with pytest.raises(SlotUnavailable):
            await _acquire_while_connected(manager, Gone(), body)  # type: ignore[arg-type]
        assert await eventually(lambda: _sync(manager.health().free == 1))
        kept = await manager.acquire(holder("keeper"), ttl_s=60, wait_s=0)
        again = AcquireRequest(holder=kept.holder, ttl_s=60, wait_s=5)
        with pytest.raises(SlotUnavailable):
            await _acquire_while_connected(manager, Gone(), again)  # type: ignore[arg-type]
        states = manager.slot_states()
    events = read_lease_events(tmp_path / "root")
    assert [(e.event, e.reason) for e in events if e.holder and e.holder.workflow_id.startswith("vanishing")] == [
        ("granted", None),
        ("released", "disconnected"),
    ]
    assert states[0].lease is not None and states[0].lease.lease_id == kept.lease_id


HOLD_S = 0.3


async def test_three_waiters_are_served_in_arrival_order_with_logged_hand_overs(one_slot):
    backend, info, client = one_slot
    started = time.time()
    first = await client.send(AcquireRequest(holder=holder("first"), ttl_s=60, wait_s=0))
    names = ["second", "third", "fourth"]
    tasks = []
    for count, name in enumerate(names, start=1):
        tasks.append(asyncio.create_task(client.send(AcquireRequest(holder=holder(name), ttl_s=60, wait_s=10))))
        assert await eventually(lambda count=count: _equals(waiters(client), count))
    order, lease, remaining = [], first, list(tasks)
    for _ in names:
        # Each lease held 0.3 s: a reset (a new filesystem for the slot, tens of ms on a loaded VM) is then a
        # small share of the slot's time, as it is for real rollouts.
        await asyncio.sleep(HOLD_S)
        await client.send(release_of(lease))
        done, _ = await asyncio.wait(remaining, timeout=2, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1
        remaining.remove(next(iter(done)))
        lease = next(iter(done)).result()
        order.append(lease.holder.workflow_id.split("-")[0])
    await asyncio.sleep(HOLD_S)
    await client.send(release_of(lease))
    ended = time.time()
    events = read_lease_events(root_of(backend, info.container_id))
    assert order == names
    assert [e.event for e in events].count("granted") == 4 and [e.event for e in events].count("queued") == 3
    assert [e.handed_over for e in events if e.event == "released"] == [True, True, True, False]
    latencies = hand_over_latencies(events)
    assert len(latencies) == 3 and all(0 <= latency < 0.5 for latency in latencies)
    assert 0 < idle_while_waiting(events) < 0.5
    assert 0.7 < utilisation(events, 1, started, ended) <= 1.0
    assert (await client.send(HealthQuery())).idle_since is not None


async def _equals(value, expected) -> bool:
    return (await value) == expected


async def _free(client) -> bool:
    return (await client.send(HealthQuery())).free == 1


async def _sync(value: bool) -> bool:
    return value
