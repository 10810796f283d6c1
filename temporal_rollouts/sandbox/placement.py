"""Where a new lease goes: fair across containers, without polling, and without leaking a slot.

One acquire runs in rounds:

1. A holder that already holds a slot on a live container gets that lease back
   (its server answers a repeated acquire with the same lease). Finding it means a
   full look at every slot of every container, so it is done only when the holder
   may hold one (a retried acquire; `may_hold`), and otherwise at most every
   `FULL_LOOK_EVERY_S`, to correct the free-slot hints below. A first acquire
   costs the same whatever the pool's size.
2. Otherwise a free slot is taken (wait_s=0 tries, most free first by the hints,
   which this process's own acquires and releases keep current; a container that
   has none says so and its hint drops to 0. A server gives a free slot away only
   when nobody waits in its line, so a newcomer never overtakes a waiter).
3. Otherwise, while fewer than `max_containers` exist, the fleet starts one more (or
   restarts a dead one in place), under the backend's lock and after counting again,
   so two workers never both start the one that was missing.
4. Otherwise the request waits in line on every live container at once
   (`sandbox.lines`), and looks again when this process starts another container.

Every round considers only containers of the request's image (an item image, or the
server's own root), so the bounds, the first-come-first-served line and the no-leak
promises hold per image. A request whose image has no container to wait on (every
container of the pool is busy with other images) looks again when this process starts
a container, or after a pause that grows to `IMAGE_PAUSE_MAX_S`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Literal

from temporal_rollouts.core.errors import SandboxUnreachable, SlotUnavailable
from temporal_rollouts.core.images import BuiltImage
from temporal_rollouts.sandbox.backends.base import ContainerInfo
from temporal_rollouts.sandbox.fleet import Fleet
from temporal_rollouts.sandbox.lines import wait_everywhere
from temporal_rollouts.sandbox.requests import SlotsQuery
from temporal_rollouts.sandbox_server.schema import (
    AcquireRequest,
    ReleaseRequest,
    ReleaseResult,
    SlotLease,
    SlotRef,
    SlotState,
)

log = logging.getLogger(__name__)

RETRY_PAUSE_S = 0.2
IMAGE_PAUSE_MAX_S = 2.0
FULL_LOOK_EVERY_S = 5.0


class Placement:
    def __init__(self, fleet: Fleet) -> None:
        self._fleet = fleet
        # Free slots per container as this process last saw them, kept current by its own acquires and
        # releases; another process's leases make them stale until the next full look.
        self._free_hints: dict[str, int] = {}
        self._looked_at = float("-inf")  # monotonic time of the last full look

    async def acquire(
        self, request: AcquireRequest, *, may_hold: bool = True, image: BuiltImage | None = None
    ) -> SlotLease:
        """Lease a slot on some container of `image` within `request.wait_s`; a holder that already has a
        slot gets the same lease again. `may_hold=False` says the holder cannot hold one yet (a first
        attempt), which spares the look at every slot of every container."""
        deadline = time.monotonic() + request.wait_s
        at_once = request.model_copy(update={"wait_s": 0.0})
        key = image.key if image is not None else None
        looked_again = False
        look = may_hold
        pause = RETRY_PAUSE_S
        while True:
            if look or time.monotonic() - self._looked_at > FULL_LOOK_EVERY_S:
                await self._fleet.restart_dead()
                for container_id, slots in (await self.look()).items():
                    if any(state.lease and state.lease.holder == request.holder for state in slots):
                        return await self._fleet.send(container_id, at_once)
            look = False  # the rounds of this call hand back every lease they do not return
            known = [container_id for container_id in self._free_hints if self._fleet.runs(container_id, key)]
            if (lease := await self._take_free(at_once, key)) is not None:
                return lease
            grown = await self._grow(set(known), looked_again, image)
            if grown == "appeared":
                looked_again = look = True
                continue
            if grown is not None:
                try:
                    return await self._fleet.send(grown.container_id, at_once)
                except SlotUnavailable:
                    continue
            if not known and not self._fleet.start_containers:
                raise SandboxUnreachable(
                    "no sandbox container is running"
                    + (f" for image {image.name}" if image else "")
                    + ", and the pool may not start one"
                )
            remaining = deadline - time.monotonic()
            open_lines = [container_id for container_id in known if self._fleet.accepting(container_id)]
            if remaining > 0 and open_lines:
                waiting = request.model_copy(update={"wait_s": remaining})
                lease = await wait_everywhere(self._fleet, open_lines, waiting, self.release)
                if lease is not None:
                    return lease
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SlotUnavailable(
                    f"no sandbox slot became free within {request.wait_s:g}s"
                    + (f" for image {image.name}" if image else "")
                )
            if open_lines:  # every line closed early (drained, died): look again
                await asyncio.sleep(min(RETRY_PAUSE_S, remaining))
            else:  # no container of this image to wait on: until this process starts one, or a while
                await _wait_for(self._fleet.next_start(), min(pause, remaining))
                pause = min(pause * 2, IMAGE_PAUSE_MAX_S)

    async def acquire_near(
        self, request: AcquireRequest, container_id: str, image: BuiltImage | None = None
    ) -> SlotLease | None:
        """A free slot on `container_id` at once, or None when it has none, does not answer or runs another
        image. A branch of a rollout asks beside its parent, whose workspace its server then copies in place.
        Only for a first attempt: a holder that may already hold a slot elsewhere must go through `acquire`."""
        key = image.key if image is not None else None
        if self._fleet.known(container_id) is None:
            await self._fleet.refresh()
        if not self._fleet.accepting(container_id) or not self._fleet.runs(container_id, key):
            return None
        try:
            lease = await self._fleet.send(container_id, request.model_copy(update={"wait_s": 0.0}))
        except (SlotUnavailable, SandboxUnreachable):
            return None
        if container_id in self._free_hints:
            self._free_hints[container_id] = max(self._free_hints[container_id] - 1, 0)
        return lease

    async def release(self, lease: SlotRef, reason: Literal["released", "reaped"] = "released") -> ReleaseResult:
        """Give a lease back; its slot is emptied for the next holder. Releasing twice is harmless."""
        request = ReleaseRequest(slot=lease.slot, lease_id=lease.lease_id, reason=reason)
        released = await self._fleet.send(lease.container_id, request)
        if lease.container_id in self._free_hints:
            hint = self._free_hints[lease.container_id] + 1
            self._free_hints[lease.container_id] = min(hint, self._fleet.slots_per_container)
        return released

    async def look(self) -> dict[str, list[SlotState]]:
        """Slot states per live container that answers (containers that do not are left out)."""
        ids = [info.container_id for info in await self._fleet.refresh()]
        answers = await asyncio.gather(*(self._fleet.send(i, SlotsQuery()) for i in ids), return_exceptions=True)
        states: dict[str, list[SlotState]] = {}
        for container_id, answer in zip(ids, answers, strict=True):
            if isinstance(answer, SandboxUnreachable):
                log.warning("sandbox container %s does not answer: %s", container_id, answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                states[container_id] = answer
        self._free_hints = {
            container_id: sum(state.lease is None and not state.quarantined for state in slots)
            for container_id, slots in states.items()
        }
        self._looked_at = time.monotonic()
        return states

    async def _take_free(self, at_once: AcquireRequest, key: str | None) -> SlotLease | None:
        hints = self._free_hints
        for container_id in sorted(hints, key=hints.__getitem__, reverse=True):
            if hints.get(container_id, 0) <= 0:
                break
            if not self._fleet.accepting(container_id) or not self._fleet.runs(container_id, key):
                continue
            try:
                lease = await self._fleet.send(container_id, at_once)
            except SlotUnavailable:
                hints[container_id] = 0
                continue
            except SandboxUnreachable:
                continue
            if container_id in hints:
                hints[container_id] = max(hints[container_id] - 1, 0)
            return lease
        return None

    async def _grow(
        self, known: set[str], looked_again: bool, image: BuiltImage | None
    ) -> ContainerInfo | Literal["appeared"] | None:
        """A container the fleet started for this request, "appeared" when one was started elsewhere
        (look again), or None when the request should wait."""
        started = await self._fleet.start_one_more(known, looked_again, image)
        if isinstance(started, ContainerInfo):
            self._free_hints[started.container_id] = self._fleet.slots_per_container
        return started


async def _wait_for(awaitable, timeout_s: float) -> None:
    """Wait for `awaitable` at most `timeout_s` (it is cancelled if it has not finished)."""
    task = asyncio.ensure_future(awaitable)
    try:
        await asyncio.wait({task}, timeout=timeout_s)
    finally:
        task.cancel()
