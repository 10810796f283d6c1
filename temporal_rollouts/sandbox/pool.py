"""SandboxPool: the worker's view of all sandbox containers, as one place to lease slots from.

The promise is that a crash costs one step, never a rollout or a slot. The design
that keeps it:

* Each sandbox server is the authority for its own slots and leases. It persists
  them (they survive a restart of its process), serves its line of waiters first
  come, first served, and takes a waiter out of line the moment its client goes.
* The registry file of containers (`data_dir/sandboxes/containers.json`, under an
  flock) is shared by every worker process on the machine. Decisions that must
  not be made twice (start one more container, restart a dead one, stop an idle
  one) are taken under its lock, after reading it again.
* The pool object in each worker is a stateless view over those two: it caches
  only addresses and HTTP clients, and asks the servers and the registry afresh
  whenever it decides something. Any number of pools, in any number of
  processes, can therefore work on the same containers, and a worker that dies
  leaves nothing behind that the servers do not already know.

Activities speak in leases: a lease names its container, so operations go to the
right server. When a server cannot be reached because its process died, the pool
restarts it in place (same id and directory, so leases, stored results and
workspaces survive) and sends the request once more. That is safe for every
request: acquire returns the holder's existing lease, release is idempotent, and
execute answers a call id from its stored result. A command that was killed with
its server has no stored result, so it runs again. Every request has a timeout,
so a hung server surfaces as SandboxUnreachable rather than a hung rollout.

How a slot is placed is in `temporal_rollouts.sandbox.placement`; health checks, scale-down and
the reaper's work are in `temporal_rollouts.sandbox.upkeep`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel

from temporal_rollouts.core.errors import ConfigError, RolloutError, SandboxUnreachable
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox import placement, transfer, upkeep
from temporal_rollouts.sandbox.backends.base import ContainerInfo, SandboxBackend
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.upkeep import HealthReport
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_TRANSFER_BYTES,
    CacheEntry,
    CacheQuery,
    FileListing,
    Holder,
    ListQuery,
    Operation,
    ReleaseResult,
    SlotLease,
    SlotLimitsRequest,
    SlotRef,
    SlotState,
    ToolOutput,
    TransferQuery,
    TransferResult,
)

log = logging.getLogger(__name__)

Result = TypeVar("Result")

__all__ = ["ContainerSlots", "HealthReport", "SandboxPool"]


class ContainerSlots(BaseModel):
    container_id: str
    url: str
    slots: list[SlotState]


class SandboxPool:
    def __init__(
        self,
        backend: SandboxBackend,
        *,
        start_containers: bool = True,
        client_timeout_s: float = 30.0,
        slots_per_container: int | None = None,
        min_containers: int = 1,
        max_containers: int = 1,
        idle_stop_s: float = 300.0,
    ) -> None:
        """`start_containers=False` makes a pool that never starts or restarts a container process;
        `max_containers` bounds how many the pool starts when every slot is taken."""
        if not 0 <= min_containers <= max(max_containers, 1):
            raise ConfigError("need 0 <= min_containers <= max_containers")
        self.backend = backend
        self.start_containers = start_containers
        self.client_timeout_s = client_timeout_s
        self.slots_per_container = slots_per_container or getattr(backend, "slots_per_container", 1)
        self.min_containers = min_containers
        self.max_containers = max_containers
        self.idle_stop_s = idle_stop_s
        self._containers: dict[str, ContainerInfo] = {}
        self._clients: dict[str, SandboxClient] = {}
        # Free slots per container as this process last saw them, kept up to date by its own acquires
        # and releases; another process's leases make it stale until the next full look (placement.py).
        self.free_hints: dict[str, int] = {}
        self.looked_at = float("-inf")  # monotonic time of the last full look at every slot
        self.containers_changed = asyncio.Event()  # set (and replaced) when this process starts a container
        self._background: set[asyncio.Task[Any]] = set()

    @classmethod
    def from_settings(cls, settings: Settings, backend: SandboxBackend | None = None) -> SandboxPool:
        """The pool over the backend `sandbox.backend` names (or over `backend`, built elsewhere)."""
        from temporal_rollouts.sandbox.backends.select import build_backend

        sandbox = settings.sandbox
        return cls(
            backend or build_backend(settings),
            start_containers=sandbox.start_containers,
            slots_per_container=sandbox.slots_per_container,
            min_containers=sandbox.min_containers,
            max_containers=sandbox.max_containers,
            idle_stop_s=sandbox.idle_stop_s,
        )

    @property
    def capacity(self) -> int:
        """The most slots this pool will lease at once: max_containers x slots_per_container."""
        return self.max_containers * self.slots_per_container

    async def ensure_running(self, min_containers: int | None = None) -> list[ContainerInfo]:
        """Reuse live containers, restart dead ones in place, start more until there are `min_containers`."""
        wanted = self.min_containers if min_containers is None else min_containers
        async with self.backend.exclusive():
            live = await self.backend.list_containers()
            if self.start_containers:
                for dead in await self.backend.dead_containers():
                    try:
                        live.append(await self.backend.restart_container(dead.container_id))
                    except RolloutError as err:
                        log.warning("cannot restart sandbox %s in place: %s", dead.container_id, err)
            if len(live) < wanted and not self.start_containers:
                raise SandboxUnreachable(
                    f"{len(live)} sandbox container(s) running, {wanted} needed, and starting them is off"
                )
            while len(live) < wanted:
                live.append(await self.backend.start_container())
        self._containers = {info.container_id: info for info in live}
        return live

    async def refresh(self) -> list[ContainerInfo]:
        live = await self.backend.list_containers()
        self.remember(live)
        return live

    def remember(self, live: list[ContainerInfo]) -> None:
        """Take a fresh listing as the pool's view of which containers exist and where."""
        self._containers = {info.container_id: info for info in live}

    def accepting(self, container_id: str) -> bool:
        """Whether new leases may go to this container (as last listed); see ContainerInfo.accepting."""
        info = self._containers.get(container_id)
        return info is None or info.accepting

    async def client(self, container_id: str) -> SandboxClient:
        info = self._containers.get(container_id)
        if info is None:
            await self.refresh()
            info = self._containers.get(container_id)
        if info is None:
            raise SandboxUnreachable(f"sandbox container {container_id} is not running")
        cached = self._clients.get(container_id)
        if cached is not None and cached.base_url == info.url.rstrip("/"):
            return cached
        if cached is not None:
            self.in_background(cached.aclose())
        fresh = SandboxClient(info.url, self.backend.token_for(info), timeout=self.client_timeout_s)
        self._clients[container_id] = fresh
        return fresh

    async def acquire(
        self, holder: Holder, ttl_s: float = DEFAULT_LEASE_TTL_S, wait_s: float = 30.0, allow_network: bool = False,
        *, may_hold: bool = True,
    ) -> SlotLease:
        """Lease a slot on some container; a holder that already has a slot gets the same lease again.
        `may_hold=False` says the holder cannot hold one yet (a first attempt), which spares the look
        at every slot of every container."""
        return await placement.acquire(self, holder, ttl_s, wait_s, allow_network, may_hold=may_hold)

    async def renew(self, lease: SlotRef, ttl_s: float = DEFAULT_LEASE_TTL_S) -> SlotLease:
        return await self.call(lease.container_id, lambda c: c.renew(lease.slot, lease.lease_id, ttl_s))

    async def release(self, lease: SlotRef, reset: bool = True) -> ReleaseResult:
        released = await self.call(lease.container_id, lambda c: c.release(lease.slot, lease.lease_id, reset))
        if lease.container_id in self.free_hints:
            self.free_hints[lease.container_id] = min(self.free_hints[lease.container_id] + 1, self.slots_per_container)
        return released

    async def execute(self, lease: SlotRef, call_id: str, operation: Operation) -> ToolOutput:
        return await self.call(lease.container_id, lambda c: c.execute(lease.slot, lease.lease_id, call_id, operation))

    async def narrow(self, lease: SlotRef, limits: SlotLimitsRequest) -> SlotLimitsRequest:
        """Lower the leased slot's limits for this lease (an env's own limits)."""
        return await self.call(lease.container_id, lambda c: c.narrow(lease.slot, lease.lease_id, limits))

    async def upload(
        self, lease: SlotRef, local: Path, remote: str, max_bytes: int = DEFAULT_MAX_TRANSFER_BYTES
    ) -> TransferResult:
        """Copy a local file or folder to `remote` in the slot, streamed; a folder is merged into `remote`."""
        local = Path(local)
        if not local.exists():
            raise FileNotFoundError(f"nothing to upload at {local}")
        if not local.is_dir():
            query = TransferQuery(slot=lease.slot, lease_id=lease.lease_id, path=remote, max_bytes=max_bytes)
            return await self.call(lease.container_id, lambda c: c.upload(query, local))
        with transfer.temp_path(suffix=".tar") as packed:
            await asyncio.to_thread(transfer.pack_folder, local, packed)
            return await self._upload_archive(lease, packed, remote, "tar", max_bytes, replace=False)

    async def download(
        self, lease: SlotRef, remote: str, local: Path, max_bytes: int = DEFAULT_MAX_TRANSFER_BYTES
    ) -> TransferResult:
        """Copy a slot's file or folder to `local`, streamed; a folder is merged into `local`."""
        local = Path(local)
        query = TransferQuery(slot=lease.slot, lease_id=lease.lease_id, path=remote, format="tar", max_bytes=max_bytes)
        with transfer.temp_path(near=local) as spool:
            size, kind = await self.call(lease.container_id, lambda c: c.download(query, spool))
            if kind == "dir":
                entries = await asyncio.to_thread(transfer.unpack_folder, spool, local)
            else:
                await asyncio.to_thread(transfer.move_into_place, spool, local)
                entries = 1
        return TransferResult(path=str(local), bytes=size, entries=entries)

    async def share(
        self, container_id: str, name: str, archive: Path, max_bytes: int = DEFAULT_MAX_TRANSFER_BYTES
    ) -> CacheEntry:
        """Put a local tar.gz into a container's shared, read-only cache as entry `name`, unless it holds
        it already (then nothing is sent). Names should name their content: the first put of one wins."""
        query = CacheQuery(name=name, max_bytes=max_bytes)
        found = await self.call(container_id, lambda c: c.cache_get(query))
        if found.present:
            return found
        return await self.call(container_id, lambda c: c.cache_put(query, Path(archive)))

    async def list_files(self, lease: SlotRef, path: str = ".", max_entries: int = 1000) -> FileListing:
        """The files under a folder of the slot (its artifacts), links not followed."""
        query = ListQuery(slot=lease.slot, lease_id=lease.lease_id, path=path, max_entries=max_entries)
        return await self.call(lease.container_id, lambda c: c.list_files(query))

    async def archive_to(self, lease: SlotRef, destination: Path, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> int:
        """Stream the leased slot's whole workspace, as a gzipped tar, into a local file; its size."""
        query = TransferQuery(slot=lease.slot, lease_id=lease.lease_id, path=".", format="tar.gz", max_bytes=max_bytes)
        size, _ = await self.call(lease.container_id, lambda c: c.download(query, destination))
        return size

    async def restore_from(
        self, lease: SlotRef, archive: Path, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES
    ) -> TransferResult:
        """Replace the leased slot's workspace with a gzipped tar written by `archive_to`, streamed."""
        return await self._upload_archive(lease, archive, ".", "tar.gz", max_bytes, replace=True)

    async def _upload_archive(
        self, lease: SlotRef, archive: Path, remote: str, format: str, max_bytes: int, *, replace: bool
    ) -> TransferResult:
        query = TransferQuery.model_validate(
            {"slot": lease.slot, "lease_id": lease.lease_id, "path": remote, "format": format,
             "max_bytes": max_bytes, "replace": replace}
        )  # fmt: skip
        return await self.call(lease.container_id, lambda c: c.upload(query, archive))

    async def slots(self) -> dict[str, list[SlotState]]:
        """Slot states per live container that answers (containers that do not are left out)."""
        ids = [info.container_id for info in await self.refresh()]
        answers = await asyncio.gather(*(self.call(i, lambda c: c.slots()) for i in ids), return_exceptions=True)
        states: dict[str, list[SlotState]] = {}
        for container_id, answer in zip(ids, answers, strict=True):
            if isinstance(answer, SandboxUnreachable):
                log.warning("sandbox container %s does not answer: %s", container_id, answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                states[container_id] = answer
        self.free_hints = {
            container_id: sum(state.lease is None and not state.quarantined for state in slots)
            for container_id, slots in states.items()
        }
        self.looked_at = time.monotonic()
        return states

    def started_container(self, info: ContainerInfo) -> None:
        """A container this process started: acquires waiting in line elsewhere look again."""
        self._containers[info.container_id] = info
        self.free_hints[info.container_id] = self.slots_per_container
        changed, self.containers_changed = self.containers_changed, asyncio.Event()
        changed.set()

    async def leases(self) -> list[SlotLease]:
        """Every lease on every live container, for people (the `slots` command) and the reaper."""
        return [state.lease for slots in (await self.slots()).values() for state in slots if state.lease]

    async def describe(self) -> list[ContainerSlots]:
        """Every live container with its slots, for people (the `slots` command)."""
        states = await self.slots()
        return [
            ContainerSlots(container_id=container_id, url=self._containers[container_id].url, slots=slots)
            for container_id, slots in states.items()
            if container_id in self._containers
        ]

    async def check_health(self) -> HealthReport:
        """Restart dead containers in place; give up on (and report the leases of) those that cannot be."""
        return await upkeep.check_health(self)

    async def scale_down(self, min_containers: int | None = None, idle_s: float | None = None) -> list[str]:
        """Stop containers above `min_containers` that had no lease and no waiter for `idle_s`; their ids."""
        return await upkeep.scale_down(
            self,
            self.min_containers if min_containers is None else min_containers,
            self.idle_stop_s if idle_s is None else idle_s,
        )

    async def reap(
        self,
        is_closed: Callable[[Holder], Awaitable[bool]],
        before_release: Callable[[SlotLease], Awaitable[None]] | None = None,
    ) -> list[SlotLease]:
        """Release (and reset) every lease whose holder `is_closed` says has closed; the leases freed."""
        return await upkeep.reap(self, is_closed, before_release)

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.client_timeout_s)
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients))
        await self.backend.aclose()

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def forget_client(self, container_id: str) -> None:
        self._containers.pop(container_id, None)
        if (client := self._clients.pop(container_id, None)) is not None:
            self.in_background(client.aclose())

    def in_background(self, coroutine: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run work that must finish even if its caller is cancelled (giving a lease back)."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def call(self, container_id: str, call: Callable[[SandboxClient], Awaitable[Result]]) -> Result:
        """Call one container; if it cannot be reached because it moved or died, call it once more
        where it is now (after restarting it in place if its process was gone)."""
        failed_url: str | None = None
        try:
            client = await self.client(container_id)
            failed_url = client.base_url
            return await call(client)
        except SandboxUnreachable:
            if not await self._recover(container_id, failed_url):
                raise
        return await call(await self.client(container_id))

    async def _recover(self, container_id: str, failed_url: str | None) -> bool:
        """True when the container answers somewhere else now, or was dead and has been restarted in place."""
        state = await self.backend.container_state(container_id)
        if state == "healthy":
            await self.refresh()
            moved = self._containers.get(container_id)
            return moved is not None and moved.url.rstrip("/") != failed_url
        if state != "dead" or not self.start_containers:
            return False
        try:
            restarted = await self.backend.restart_container(container_id)
        except RolloutError as err:
            log.warning("sandbox %s is dead and could not be restarted in place: %s", container_id, err)
            return False
        log.info("sandbox %s was dead; restarted it in place at %s", container_id, restarted.url)
        self._containers[container_id] = restarted
        return True
