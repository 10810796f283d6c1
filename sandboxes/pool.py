"""SandboxPool: the worker's view of all sandbox containers, as one place to lease slots from.

Activities hold a pool and speak in leases: the lease names its container, so
operations go to the right server, found through the backend (and found again
if that server was restarted on a new port).

Placement is simple for now: a free slot anywhere is taken first (the container
with most free slots first); when every slot is busy the request waits first come,
first served on one container, the one with the fewest waiters per slot. Waiters
are therefore fair within a container but not across containers.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TypeVar

from pydantic import BaseModel

from rollouts.errors import ConfigError, SandboxUnreachable, SlotUnavailable
from rollouts.settings import Settings
from sandboxes.backend import ContainerInfo, SandboxBackend
from sandboxes.client import SandboxClient
from sandboxes.schema import HealthStatus, Holder, Operation, ReleaseResult, SlotLease, SlotState, ToolOutput

log = logging.getLogger(__name__)

Result = TypeVar("Result")


class ContainerSlots(BaseModel):
    container_id: str
    url: str
    slots: list[SlotState]


class SandboxPool:
    def __init__(
        self, backend: SandboxBackend, *, start_containers: bool = True, client_timeout_s: float = 30.0
    ) -> None:
        self.backend = backend
        self.start_containers = start_containers
        self.client_timeout_s = client_timeout_s
        self._containers: dict[str, ContainerInfo] = {}
        self._clients: dict[str, SandboxClient] = {}
        self._refresh_lock = asyncio.Lock()

    @classmethod
    def from_settings(cls, settings: Settings) -> SandboxPool:
        from sandboxes.local import LocalBackend

        if settings.sandbox.backend != "local":
            raise ConfigError(f"unknown sandbox backend {settings.sandbox.backend!r}")
        return cls(LocalBackend.from_settings(settings), start_containers=settings.sandbox.start_local)

    async def ensure_running(self, min_containers: int = 1) -> list[ContainerInfo]:
        """Reuse the live containers the backend knows; start more until there are `min_containers`."""
        async with self._refresh_lock:
            live = await self.backend.list_containers()
            if len(live) < min_containers and not self.start_containers:
                raise SandboxUnreachable(
                    f"{len(live)} sandbox container(s) running, {min_containers} needed, and starting them is off"
                )
            while len(live) < min_containers:
                live.append(await self.backend.start_container())
            self._containers = {info.container_id: info for info in live}
            return live

    async def refresh(self) -> list[ContainerInfo]:
        async with self._refresh_lock:
            live = await self.backend.list_containers()
            self._containers = {info.container_id: info for info in live}
            return live

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
            await cached.aclose()
        fresh = SandboxClient(info.url, info.read_token(), timeout=self.client_timeout_s)
        self._clients[container_id] = fresh
        return fresh

    async def acquire(
        self, holder: Holder, ttl_s: float = 1800.0, wait_s: float = 30.0, allow_network: bool = False
    ) -> SlotLease:
        """Lease a slot on some container; a holder that already has a slot gets the same lease again."""
        states = await self.slots()
        if not states:
            raise SandboxUnreachable("no sandbox container is running")
        for container_id, slots in states.items():
            if any(state.lease and state.lease.holder == holder for state in slots):
                return await self._on(container_id, lambda c: c.acquire(holder, ttl_s, 0.0, allow_network))
        free = {container_id: sum(state.lease is None for state in slots) for container_id, slots in states.items()}
        for container_id in sorted(free, key=free.__getitem__, reverse=True):
            if free[container_id] == 0:
                break
            try:
                return await self._on(container_id, lambda c: c.acquire(holder, ttl_s, 0.0, allow_network))
            except SlotUnavailable:
                continue
        target = await self._least_crowded(list(states))
        return await self._on(target, lambda c: c.acquire(holder, ttl_s, wait_s, allow_network))

    async def renew(self, lease: SlotLease, ttl_s: float = 1800.0) -> SlotLease:
        return await self._on(lease.container_id, lambda c: c.renew(lease.slot, lease.lease_id, ttl_s))

    async def release(self, lease: SlotLease, reset: bool = True) -> ReleaseResult:
        return await self._on(lease.container_id, lambda c: c.release(lease.slot, lease.lease_id, reset))

    async def execute(self, lease: SlotLease, call_id: str, operation: Operation) -> ToolOutput:
        return await self._on(lease.container_id, lambda c: c.execute(lease.slot, lease.lease_id, call_id, operation))

    async def slots(self) -> dict[str, list[SlotState]]:
        """Slot states per container that answers (containers that do not are left out)."""
        if not self._containers:
            await self.refresh()
        ids = list(self._containers)
        answers = await asyncio.gather(*(self._on(i, lambda c: c.slots()) for i in ids), return_exceptions=True)
        states: dict[str, list[SlotState]] = {}
        for container_id, answer in zip(ids, answers, strict=True):
            if isinstance(answer, SandboxUnreachable):
                log.warning("sandbox container %s does not answer: %s", container_id, answer)
            elif isinstance(answer, BaseException):
                raise answer
            else:
                states[container_id] = answer
        return states

    async def describe(self) -> list[ContainerSlots]:
        """Every live container with its slots, for people (the `slots` command)."""
        await self.refresh()
        states = await self.slots()
        return [
            ContainerSlots(container_id=container_id, url=self._containers[container_id].url, slots=slots)
            for container_id, slots in states.items()
            if container_id in self._containers
        ]

    async def aclose(self) -> None:
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients))

    async def __aenter__(self) -> SandboxPool:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def _least_crowded(self, container_ids: list[str]) -> str:
        healths = await asyncio.gather(
            *(self._on(i, lambda c: c.health()) for i in container_ids), return_exceptions=True
        )
        answered = [
            (health.waiters / health.slots, container_id)
            for container_id, health in zip(container_ids, healths, strict=True)
            if isinstance(health, HealthStatus)
        ]
        return min(answered)[1] if answered else container_ids[0]

    async def _on(self, container_id: str, call: Callable[[SandboxClient], Awaitable[Result]]) -> Result:
        """Call one container; if it is unreachable because it moved to a new address, call it there once more."""
        client = await self.client(container_id)
        try:
            return await call(client)
        except SandboxUnreachable:
            await self.refresh()
            moved = self._containers.get(container_id)
            if moved is None or moved.url.rstrip("/") == client.base_url:
                raise
            return await call(await self.client(container_id))
