"""Where a new lease goes: fair across containers, without polling, and without leaking a slot.

One acquire runs in rounds:

1. A holder that already holds a slot on a live container gets that lease back
   (its server answers a repeated acquire with the same lease). Finding it means a
   full look at every slot of every container, so it is done only when the holder
   may hold one (a retried acquire; `may_hold`), and otherwise at most every
   `FULL_LOOK_EVERY_S`, to correct the free-slot hints below. A first acquire
   costs the same whatever the pool's size.
2. Otherwise a free slot is taken (wait_s=0 tries, most free first by the pool's
   hints, which its own acquires and releases keep current; a container that has
   none says so and its hint drops to 0. A server gives a free slot away only when
   nobody waits in its line, so a newcomer never overtakes a waiter).
3. Otherwise, while fewer than `max_containers` exist, one more is started (or a
   dead one restarted in place), under the registry lock and after counting again,
   so two workers never both start the one that was missing.
4. Otherwise the request waits in line on every live container at once, each wait
   with its own ticket. The first grant wins; every other ticket is withdrawn and
   its answer read, and a lease granted in the race is released (and reset) so it
   goes to the next in line. Each line is first come, first served, so the whole
   is approximately first come, first served. When this process starts another
   container meanwhile, the waits are withdrawn and the request looks again, so a
   waiter is not left behind a full container while a new one sits empty.

An in-flight acquire is never simply dropped: a response that is never read may
carry a lease nobody knows about. A wait is ended by withdrawing its ticket and
reading the answer; only a server that does not answer even then (it is broken)
has its request cancelled, which also closes the connection and so takes the
request out of that server's line if it still can.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from typing import TYPE_CHECKING

from temporal_rollouts.core.errors import SandboxUnreachable, SlotUnavailable
from temporal_rollouts.sandbox import upkeep
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox_server.schema import Holder, SlotLease

if TYPE_CHECKING:
    from temporal_rollouts.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.2
FULL_LOOK_EVERY_S = 5.0


async def acquire(pool: SandboxPool, holder: Holder, ttl_s: float, wait_s: float, allow_network: bool,
                  *, may_hold: bool = True) -> SlotLease:
    deadline = time.monotonic() + wait_s
    looked_again = False
    look = may_hold
    while True:
        if look or time.monotonic() - pool.looked_at > FULL_LOOK_EVERY_S:
            if pool.start_containers and await pool.backend.dead_containers():
                await upkeep.check_health(pool)
            states = await pool.slots()
            for container_id, slots in states.items():
                if any(state.lease and state.lease.holder == holder for state in slots):
                    return await pool.call(container_id, lambda c: c.acquire(holder, ttl_s, 0.0, allow_network))
        look = False  # the rounds of this call hand back every lease they do not return
        known = list(pool.free_hints)
        if (lease := await _take_free(pool, holder, ttl_s, allow_network)) is not None:
            return lease
        grown = await _grow(pool, set(known), looked_again)
        if grown == "":
            looked_again = look = True
            continue
        if grown is not None:
            try:
                return await pool.call(grown, lambda c: c.acquire(holder, ttl_s, 0.0, allow_network))
            except SlotUnavailable:
                continue
        if not known and not pool.start_containers:
            raise SandboxUnreachable("no sandbox container is running, and the pool may not start one")
        remaining = deadline - time.monotonic()
        if remaining > 0:
            open_lines = [container_id for container_id in known if pool.accepting(container_id)]
            lease = await wait_everywhere(pool, open_lines, holder, ttl_s, remaining, allow_network)
            if lease is not None:
                return lease
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise SlotUnavailable(f"no sandbox slot became free within {wait_s:g}s")
        await asyncio.sleep(min(RETRY_PAUSE_S, remaining))  # every line closed early (drained, died): look again


async def _take_free(pool: SandboxPool, holder: Holder, ttl_s: float, allow_network: bool) -> SlotLease | None:
    hints = pool.free_hints
    for container_id in sorted(hints, key=hints.__getitem__, reverse=True):
        if hints.get(container_id, 0) <= 0:
            break
        if not pool.accepting(container_id):
            continue
        try:
            lease = await pool.call(container_id, lambda c: c.acquire(holder, ttl_s, 0.0, allow_network))
        except SlotUnavailable:
            hints[container_id] = 0
            continue
        except SandboxUnreachable:
            continue
        if container_id in hints:
            hints[container_id] = max(hints[container_id] - 1, 0)
        return lease
    return None


async def _grow(pool: SandboxPool, seen: set[str], looked_again: bool) -> str | None:
    """Start one container if the pool may and fewer than the maximum exist (live or dead, as a dead one
    will be restarted); its id, "" when another process started one meanwhile (look again, once), or
    None when the request should wait instead."""
    if not pool.start_containers:
        return None
    async with pool.backend.exclusive():
        live = await pool.backend.list_containers()
        dead = await pool.backend.dead_containers()
        if not looked_again and {info.container_id for info in live} - seen:
            return ""
        if sum(info.accepting for info in live) + len(dead) >= pool.max_containers:
            return None
        started = await pool.backend.start_container()
    pool.started_container(started)
    log.info("every sandbox slot was taken: started container %s", started.container_id)
    return started.container_id


async def wait_everywhere(
    pool: SandboxPool, container_ids: list[str], holder: Holder, ttl_s: float, wait_s: float, allow_network: bool
) -> SlotLease | None:
    """Wait in line on every container at once; the first lease granted, or None when none was."""
    clients: dict[str, SandboxClient] = {}
    for container_id in container_ids:
        try:
            clients[container_id] = await pool.client(container_id)
        except SandboxUnreachable:
            continue
    waits: dict[asyncio.Task[SlotLease], tuple[SandboxClient, str]] = {}
    for client in clients.values():
        ticket = f"{holder.workflow_id}/{uuid.uuid4().hex}"
        task = asyncio.create_task(client.acquire(holder, ttl_s, wait_s, allow_network, ticket=ticket))
        waits[task] = (client, ticket)
    won: SlotLease | None = None
    changed = asyncio.ensure_future(pool.containers_changed.wait())
    try:
        pending: set[asyncio.Future] = {*waits, changed}
        while waits.keys() & pending and won is None and not changed.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            won = next((task.result() for task in done if task in waits and _granted(task)), None)
    except BaseException:
        await _settle_in_background(pool, waits, keep=None)
        raise
    finally:
        changed.cancel()
    try:
        await asyncio.shield(pool.in_background(_settle(pool, waits, keep=won)))
    except asyncio.CancelledError:
        if won is not None:
            pool.in_background(pool.release(won, reset=True))
        raise
    if won is None and (problem := _lasting_problem(waits)) is not None:
        raise problem
    return won


def _lasting_problem(waits: dict[asyncio.Task[SlotLease], tuple[SandboxClient, str]]) -> BaseException | None:
    """An error that waiting again would only repeat (a bad request, a wrong token), if a wait ended in one."""
    for task in waits:
        if task.done() and not task.cancelled():
            error = task.exception()
            if error is not None and not isinstance(error, (SlotUnavailable, SandboxUnreachable)):
                return error
    return None


async def _settle(
    pool: SandboxPool, waits: dict[asyncio.Task[SlotLease], tuple[SandboxClient, str]], keep: SlotLease | None
) -> None:
    """Withdraw every wait still open, read every answer, and release every lease but `keep`."""
    open_waits = [task for task in waits if not task.done()]
    await asyncio.gather(*(waits[task][0].withdraw(waits[task][1]) for task in open_waits), return_exceptions=True)
    if open_waits:
        _, unanswered = await asyncio.wait(open_waits, timeout=pool.client_timeout_s)
        for task in unanswered:
            log.warning("sandbox %s did not answer a withdrawn acquire; dropping it", waits[task][0].base_url)
            task.cancel()
        await asyncio.gather(*unanswered, return_exceptions=True)
    extra = [task.result() for task in waits if _granted(task)]
    extra = [lease for lease in extra if keep is None or lease.lease_id != keep.lease_id]
    for lease in extra:
        log.info("releasing slot %d of %s, granted in a race it lost", lease.slot, lease.container_id)
    results = await asyncio.gather(*(pool.release(lease, reset=True) for lease in extra), return_exceptions=True)
    for lease, result in zip(extra, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("could not release surplus lease %s: %s", lease.lease_id, result)


async def _settle_in_background(
    pool: SandboxPool, waits: dict[asyncio.Task[SlotLease], tuple[SandboxClient, str]], keep: SlotLease | None
) -> None:
    settling = pool.in_background(_settle(pool, waits, keep))
    try:
        await asyncio.shield(settling)
    except asyncio.CancelledError:
        pass


def _granted(task: asyncio.Task[SlotLease]) -> bool:
    """Done with a lease; also marks any exception as retrieved."""
    return task.done() and not task.cancelled() and task.exception() is None
