"""SandboxPool over several real one-slot containers: scaling up, waiting everywhere, races, scale-down, reaping."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from temporal_rollouts.core.settings import PoolOptions
from temporal_rollouts.core.errors import SlotUnavailable
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.state.lease_log import read_lease_events
from temporal_rollouts.sandbox_server.schema import AcquireRequest, DrainRequest, Holder, SlotLease
from tests.support.sandbox import ONE_CONTAINER, eventually, holder, local_backend, root_of, sandbox_settings


@pytest.fixture
async def backend(tmp_path):
    async with local_backend(tmp_path / "data", 1) as backend:
        yield backend


async def all_waiting(pool: SandboxPool, count: int) -> bool:
    ids = [info.container_id for info in await pool.fleet.refresh()]
    healths = [await pool.fleet.send(container_id, HealthQuery()) for container_id in ids]
    return all(health.waiters == count for health in healths)


async def test_the_pool_scales_up_to_max_containers_then_waits(backend):
    async with SandboxPool(backend, PoolOptions(max_containers=2)) as pool:
        await pool.fleet.ensure_running()
        first = await pool.acquire(holder("first"), ttl_s=60, wait_s=0)
        second = await pool.acquire(holder("second"), ttl_s=60, wait_s=0)
        waiting = asyncio.create_task(pool.acquire(holder("third"), ttl_s=60, wait_s=10))
        assert await eventually(lambda: all_waiting(pool, 1))
        assert len(backend.registry.load()) == 2 and first.container_id != second.container_id
        await pool.release(second)
        third = await asyncio.wait_for(waiting, 3)
        assert (third.container_id, third.slot) == (second.container_id, second.slot)
        assert await eventually(lambda: all_waiting(pool, 0))
        assert len(await pool.leases()) == 2 and len(backend.registry.load()) == 2


async def test_two_pools_scaling_at_once_start_one_container_between_them(backend, tmp_path):
    other = LocalBackend(tmp_path / "data", sandbox_settings(slots_per_container=1))
    async with (
        SandboxPool(backend, PoolOptions(max_containers=2)) as pool,
        SandboxPool(other, PoolOptions(max_containers=2)) as rival,
    ):
        await pool.fleet.ensure_running()
        held = await pool.acquire(holder("held"), ttl_s=60, wait_s=0)
        racing = [
            asyncio.create_task(p.acquire(holder(f"racer{n}"), ttl_s=60, wait_s=10))
            for n, p in enumerate([pool, rival])
        ]
        done, pending = await asyncio.wait(racing, timeout=5, return_when=asyncio.FIRST_COMPLETED)
        assert len(done) == 1 and len(pending) == 1
        assert len(backend.registry.load()) == 2
        await pool.release(held)
        late = await asyncio.wait_for(pending.pop(), 3)
    assert (late.container_id, late.slot) == (held.container_id, held.slot)


async def test_a_wait_on_every_container_takes_whichever_frees_first(backend):
    async with SandboxPool(backend, PoolOptions(max_containers=2)) as pool:
        await pool.fleet.ensure_running(min_containers=2)
        a = await pool.acquire(holder("a"), ttl_s=60, wait_s=0)
        b = await pool.acquire(holder("b"), ttl_s=60, wait_s=0)
        won_b = await wait_while_releasing(pool, b)
        assert {lease.lease_id for lease in await pool.leases()} == {a.lease_id, won_b.lease_id}
        won_a = await wait_while_releasing(pool, a)
        assert {lease.lease_id for lease in await pool.leases()} == {won_a.lease_id, won_b.lease_id}
    for lease in (a, b):
        withdrawn = [e for e in read_lease_events(root_of(backend, lease.container_id)) if e.event == "withdrawn"]
        assert [e.reason for e in withdrawn] == ["withdrawn"]


async def wait_while_releasing(pool: SandboxPool, freed: SlotLease) -> SlotLease:
    """A new acquire waits on both containers; `freed` is released; the waiter must get exactly that slot."""
    waiting = asyncio.create_task(pool.acquire(holder("waiter"), ttl_s=60, wait_s=10))
    assert await eventually(lambda: all_waiting(pool, 1))
    await pool.release(freed)
    won = await asyncio.wait_for(waiting, 3)
    assert (won.container_id, won.slot) == (freed.container_id, freed.slot)
    assert await eventually(lambda: all_waiting(pool, 0))
    return won


async def test_when_two_servers_grant_at_once_the_pool_keeps_one_and_releases_the_other(backend):
    async with SandboxPool(backend, PoolOptions(max_containers=2)) as pool:
        await pool.fleet.ensure_running(min_containers=2)
        leases = [await pool.acquire(holder(name), ttl_s=60, wait_s=0) for name in ("a", "b")]
        racer = holder("racer")
        waiting = asyncio.create_task(pool.acquire(racer, ttl_s=60, wait_s=10))
        assert await eventually(lambda: all_waiting(pool, 1))
        release_both_while_the_pool_cannot_react(backend, leases)
        won = await asyncio.wait_for(waiting, 3)

        async def only_the_winner_is_held() -> bool:
            return [lease.lease_id for lease in await pool.leases()] == [won.lease_id]

        assert await eventually(only_the_winner_is_held)
    loser = next(lease.container_id for lease in leases if lease.container_id != won.container_id)
    events = [e for e in read_lease_events(root_of(backend, loser)) if e.holder == racer]
    assert [e.event for e in events] == ["queued", "granted", "released"]


def release_both_while_the_pool_cannot_react(backend: LocalBackend, leases: list[SlotLease]) -> None:
    """Blocks the event loop (so the pool sees both grants before it can withdraw either) while
    other threads release both leases; each release answers once its slot was handed on."""

    def release(lease: SlotLease) -> None:
        info = backend.registry.get(lease.container_id)
        assert info is not None
        body = {"slot": lease.slot, "lease_id": lease.lease_id, "reset": False}
        headers = {"Authorization": f"Bearer {info.read_token()}"}
        httpx.post(f"{info.url}/slots/release", json=body, headers=headers, timeout=10).raise_for_status()

    with ThreadPoolExecutor(2) as threads:
        list(threads.map(release, leases))


async def test_scale_down_stops_only_idle_containers_above_the_minimum(backend):
    async with SandboxPool(backend, PoolOptions(min_containers=0, max_containers=3)) as pool:
        await pool.fleet.ensure_running(min_containers=3)
        busy = await pool.acquire(holder("busy"), ttl_s=60, wait_s=0)
        assert await pool.fleet.scale_down(min_containers=0, idle_s=60) == []
        await asyncio.sleep(0.1)
        stopped_one = await pool.fleet.scale_down(min_containers=2, idle_s=0.05)
        stopped_rest = await pool.fleet.scale_down(min_containers=0, idle_s=0.05)
        survivors = [info.container_id for info in await backend.list_containers()]
        output = await pool.lease(busy).execute("still-here", _exec("echo alive"))
    assert len(stopped_one) == 1 and len(stopped_rest) == 1 and busy.container_id not in stopped_one + stopped_rest
    assert survivors == [busy.container_id] and output.output == "alive\n"


async def test_a_drained_server_refuses_new_leases(backend):
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        (info,) = await pool.fleet.ensure_running()
        client = await pool.fleet.client(info.container_id)
        await asyncio.sleep(0.05)
        assert (await client.send(DrainRequest(idle_s=0.01))).draining
        assert (await client.send(HealthQuery())).draining
        with pytest.raises(SlotUnavailable, match="draining"):
            await client.send(AcquireRequest(holder=holder("too-late"), ttl_s=60, wait_s=0))


async def test_reap_frees_only_leases_of_closed_holders(backend):
    async with SandboxPool(backend, PoolOptions(max_containers=2)) as pool:
        await pool.fleet.ensure_running(min_containers=2)
        closed, running = holder("closed"), holder("running")
        gone = await pool.acquire(closed, ttl_s=60, wait_s=0)
        kept = await pool.acquire(running, ttl_s=60, wait_s=0)
        asked: list[Holder] = []

        async def is_closed(who: Holder) -> bool:
            asked.append(who)
            return who == closed

        assert {lease.lease_id for lease in await pool.leases()} == {gone.lease_id, kept.lease_id}
        freed = await pool.reap(is_closed)
        remaining = await pool.leases()
    assert [lease.lease_id for lease in freed] == [gone.lease_id]
    assert [lease.lease_id for lease in remaining] == [kept.lease_id]
    assert sorted(who.workflow_id for who in asked) == sorted([closed.workflow_id, running.workflow_id])
    events = read_lease_events(root_of(backend, gone.container_id))
    assert [e.event for e in events if e.lease_id == gone.lease_id] == ["granted", "reaped"]


def _exec(command: str):
    from temporal_rollouts.sandbox_server.schema import ExecOp

    return ExecOp(command=command)


async def test_a_waiter_takes_a_slot_of_a_container_started_after_it_began_waiting(backend):
    async with SandboxPool(backend, PoolOptions(max_containers=1)) as pool:
        await pool.fleet.ensure_running()
        held = await pool.acquire(holder("held"), ttl_s=60, wait_s=0)
        waiting = asyncio.create_task(pool.acquire(holder("waiter"), ttl_s=60, wait_s=30, may_hold=False))
        assert await eventually(lambda: all_waiting(pool, 1))
        pool.fleet.options.max_containers = 2  # room for one more (as an operator raising max_containers would)
        grower = await pool.acquire(holder("grower"), ttl_s=60, wait_s=0, may_hold=False)  # starts container 2
        assert grower.container_id != held.container_id
        await pool.release(grower)
        late = await asyncio.wait_for(waiting, 10)  # not stuck behind `held` until it is released
        assert late.container_id == grower.container_id
        assert await eventually(lambda: all_waiting(pool, 0))


async def test_a_first_acquire_does_not_look_at_every_slot(backend, monkeypatch):
    async with SandboxPool(backend, PoolOptions(max_containers=1)) as pool:
        await pool.fleet.ensure_running()
        await pool.release(await pool.acquire(holder("first"), ttl_s=60, wait_s=0))  # one full look, then hints
        looks = []
        real_look = pool.placement.look

        async def counted_look():
            looks.append(1)
            return await real_look()

        monkeypatch.setattr(pool.placement, "look", counted_look)
        second = holder("second")
        lease = await pool.acquire(second, ttl_s=60, wait_s=10, may_hold=False)
        assert looks == []
        # A retried acquire (its holder may already hold a slot) looks, and gets the same lease back.
        again = await pool.acquire(second, ttl_s=60, wait_s=0, may_hold=True)
        assert looks == [1] and again.lease_id == lease.lease_id
