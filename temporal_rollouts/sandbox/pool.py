"""SandboxPool: the worker's one place to lease sandbox slots from, over every container of a backend.

The promise is that a crash costs one step, never a rollout or a slot. The design
that keeps it:

* Each sandbox server is the authority for its own slots and leases. It persists
  them (they survive a restart of its process), serves its line of waiters first
  come, first served, and takes a waiter out of line the moment its client goes.
* The backend is the registry of containers, shared by every worker process;
  decisions that must not be made twice are taken under its lock.
* The pool in each worker is a stateless view over those two: it caches only
  addresses, clients and hints, and asks the servers and the backend afresh
  whenever it decides something. Any number of pools, in any number of processes,
  can work on the same containers, and a worker that dies leaves nothing behind
  that the servers do not already know.

The pool is three parts, each owning its state, each using only the one below:
the fleet (`sandbox.fleet`: containers, a client for each, starting, restarting and
stopping them), placement (`sandbox.placement` and `sandbox.lines`: where a new
lease goes, by free-slot hints) and this front door: acquire and release, a
`Lease` to work in (`sandbox.lease`), the views for people and the reaper. Every
request to a server is declared once, in `sandbox.requests`.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from pydantic import BaseModel

from temporal_rollouts.core.errors import SandboxUnreachable
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.settings import PoolOptions, Settings
from temporal_rollouts.sandbox.backends.base import SandboxBackend
from temporal_rollouts.sandbox.fleet import Fleet
from temporal_rollouts.sandbox.lease import Lease
from temporal_rollouts.sandbox.placement import Placement
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_LEASE_TTL_S,
    AcquireRequest,
    Holder,
    ReleaseResult,
    SlotLease,
    SlotRef,
    SlotState,
)

log = logging.getLogger(__name__)

__all__ = ["ContainerSlots", "SandboxPool"]


class ContainerSlots(BaseModel):
    container_id: str
    url: str
    image: str | None = None
    """The name of the item image its slots run on; None: the server's own root."""
    slots: list[SlotState]


class SandboxPool:
    fleet: Fleet
    placement: Placement

    def __init__(self, backend: SandboxBackend, options: PoolOptions | None = None) -> None:
        """A pool over `backend`'s containers (what they start with is the backend's, `backend.sandbox`);
        `options`: how many containers it keeps and starts, of all images and of one item image, and how
        long it waits for one (the defaults if None)."""
        self.fleet = Fleet(backend, options)
        self.placement = Placement(self.fleet)

    @classmethod
    def from_settings(cls, settings: Settings, backend: SandboxBackend | None = None) -> SandboxPool:
        """The pool over the backend `sandbox.backend` names (or over `backend`, built elsewhere)."""
        from temporal_rollouts.sandbox.backends.select import build_backend

        return cls(backend or build_backend(settings), settings.sandbox)

    @property
    def capacity(self) -> int:
        """The most slots this pool will lease at once: max_containers x slots_per_container."""
        return self.fleet.options.max_containers * self.fleet.slots_per_container

    async def acquire(
        self,
        holder: Holder,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        wait_s: float = 30.0,
        allow_network: bool = False,
        *,
        may_hold: bool = True,
        near: str | None = None,
        image: BuiltImage | None = None,
    ) -> SlotLease:
        """Lease a slot on some container of `image` (None: the server's own root), waiting up to `wait_s`;
        see `Placement.acquire`. `near` names a container to try first (only when the holder cannot hold a
        slot yet: `may_hold=False`)."""
        request = AcquireRequest(holder=holder, ttl_s=ttl_s, wait_s=wait_s, allow_network=allow_network)
        if near is not None and not may_hold and (lease := await self.placement.acquire_near(request, near, image)):
            return lease
        return await self.placement.acquire(request, may_hold=may_hold, image=image)

    async def build_image(self, spec: ImageSpec, wanted_by: str) -> BuiltImage:
        """Make an item's image ready for this pool's containers (build it once, or find it built)."""
        return await self.fleet.backend.build_image(spec, wanted_by)

    async def release(self, lease: SlotRef) -> ReleaseResult:
        """Give a lease back; its slot is emptied for the next holder. Releasing twice is harmless."""
        return await self.placement.release(lease)

    def lease(self, ref: SlotRef, *, max_transfer_bytes: int | None = None) -> Lease:
        """The leased slot to work in: renew, narrow, execute, move files (at most `max_transfer_bytes` at a time:
        by default the servers' own cap)."""
        return Lease(self.fleet, ref, max_transfer_bytes=max_transfer_bytes)

    async def leases(self) -> list[SlotLease]:
        """Every lease on every live container, for people (the `slots` command) and the reaper."""
        return [state.lease for slots in (await self.placement.look()).values() for state in slots if state.lease]

    async def describe(self) -> list[ContainerSlots]:
        """Every live container with its slots, for people (the `slots` command)."""
        states = await self.placement.look()
        return [
            ContainerSlots(
                container_id=container_id, url=info.url, image=info.image.name if info.image else None, slots=slots
            )
            for container_id, slots in states.items()
            if (info := self.fleet.known(container_id)) is not None
        ]

    async def reap(
        self,
        is_closed: Callable[[Holder], Awaitable[bool]],
        before_release: Callable[[SlotLease], Awaitable[None]] | None = None,
    ) -> list[SlotLease]:
        """Release (and reset) every lease whose holder `is_closed` says has closed; the leases freed.
        `before_release` may save what the slot holds first."""
        freed: list[SlotLease] = []
        verdicts: dict[tuple[str, str], bool] = {}
        for lease in await self.leases():
            key = (lease.holder.workflow_id, lease.holder.run_id)
            if key not in verdicts:
                try:
                    verdicts[key] = await is_closed(lease.holder)
                except Exception as err:
                    log.warning("cannot tell whether %s/%s has closed: %s", *key, err)
                    verdicts[key] = False
            if not verdicts[key]:
                continue
            if before_release is not None:
                try:
                    await before_release(lease)
                except Exception as err:
                    log.warning(
                        "could not save slot %d of %s before reaping it: %s", lease.slot, lease.container_id, err
                    )
            try:
                result = await self.placement.release(lease, reason="reaped")
            except SandboxUnreachable as err:
                log.warning("cannot reap lease %s on %s: %s", lease.lease_id, lease.container_id, err)
                continue
            if result.released:
                log.info("reaped slot %d of %s from closed workflow %s", lease.slot, lease.container_id, key[0])
                freed.append(lease)
        return freed

    async def aclose(self) -> None:
        await self.fleet.aclose()

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
