"""The fleet: a backend's sandbox containers, a client for each, and keeping them running.

The backend is the registry of containers (for the local backend a registry file under
an flock, for Nomad its jobs, for Modal its sandboxes), shared by every worker process.
The fleet keeps only addresses and HTTP clients, and lists again whenever it decides
something, so any number of fleets in any number of processes can manage the same
containers, and one that dies leaves nothing the backend and the servers do not know.
Decisions that must not be made twice (start one more, restart a dead one, stop an idle
one) are taken under the backend's lock (`exclusive`), after listing again; a stop
happens only after the server itself agreed that it is idle (`POST /drain`, atomic on
the server, after which it refuses new leases).

Each container runs one image: the server's own root (`image` None: items that name no
image) or an item image. The bounds hold per image: at most `max_containers_per_image` of
one image, `max_containers` of all together, `min_containers` kept of the server's own
root and none of an item image, whose containers are stopped once idle. An image that needs
a container while all `max_containers` exist takes the place of the longest-idle container
of another image (`make_room`), so a task set of many images runs within the same bound.

A request to a container that cannot be reached because its process died restarts it
in place (same id and directory, so leases, stored results and workspaces survive) and
is sent once more. That is safe for every request: acquire returns the holder's
existing lease, release is idempotent, and execute answers a call id from its stored
result. A command that was killed with its server has no stored result, so it runs again.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, Field

from temporal_rollouts.core.errors import RolloutError, SandboxUnreachable
from temporal_rollouts.core.images import BuiltImage
from temporal_rollouts.core.settings import PoolOptions
from temporal_rollouts.sandbox.backends.base import ContainerInfo, SandboxBackend
from temporal_rollouts.sandbox.backends.registry import RegistryBusy
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.schema import DrainRequest, HealthStatus, SlotLease

log = logging.getLogger(__name__)

Result = TypeVar("Result")


class HealthReport(BaseModel):
    healthy: list[str] = Field(default_factory=list, description="Containers that answered, restarted ones included.")
    restarted: list[str] = Field(default_factory=list, description="Dead containers restarted in place.")
    removed: list[str] = Field(default_factory=list, description="Dead containers that could not be restarted.")
    lost_leases: list[SlotLease] = Field(default_factory=list, description="Leases the removed containers held.")


class Fleet:
    backend: SandboxBackend
    options: PoolOptions
    """How many containers (of all images together, and of one item image), and how long to wait for one:
    the pool's options, whole."""

    def __init__(self, backend: SandboxBackend, options: PoolOptions | None = None) -> None:
        self.backend = backend
        self.options = options if options is not None else PoolOptions()
        self._containers: dict[str, ContainerInfo] = {}
        self._clients: dict[str, SandboxClient] = {}
        self._started = asyncio.Event()  # set, and replaced, when this process starts a container
        self._background: set[asyncio.Task[Any]] = set()

    @property
    def start_containers(self) -> bool:
        """False: this fleet never starts or restarts a container process (they are run elsewhere)."""
        return self.backend.start_containers

    @property
    def slots_per_container(self) -> int:
        return self.backend.slots_per_container

    # which containers there are ----------------------------------------------------------

    async def ensure_running(self, min_containers: int | None = None) -> list[ContainerInfo]:
        """Reuse live containers, restart dead ones in place, start more until there are `min_containers`
        (of the server's own root: item images get containers when their rollouts need them)."""
        wanted = self.options.min_containers if min_containers is None else min_containers
        async with self.backend.exclusive():
            live = await self.backend.list_containers()
            if self.start_containers:
                for dead in await self.backend.dead_containers():
                    try:
                        live.append(await self.backend.restart_container(dead.container_id))
                    except RolloutError as err:
                        log.warning("cannot restart sandbox %s in place: %s", dead.container_id, err)
            plain = sum(info.image is None for info in live)
            if plain < wanted and not self.start_containers:
                raise SandboxUnreachable(
                    f"{plain} sandbox container(s) running, {wanted} needed, and starting them is off"
                )
            for _ in range(wanted - plain):
                live.append(await self.backend.start_container())
        self._remember(live)
        return live

    async def refresh(self) -> list[ContainerInfo]:
        """The live containers, listed afresh (and remembered)."""
        live = await self.backend.list_containers()
        self._remember(live)
        return live

    def known(self, container_id: str) -> ContainerInfo | None:
        """The container as last listed, if it was."""
        return self._containers.get(container_id)

    def accepting(self, container_id: str) -> bool:
        """Whether new leases may go to this container (as last listed); see ContainerInfo.accepting."""
        info = self._containers.get(container_id)
        return info is None or info.accepting

    def runs(self, container_id: str, image_key: str | None) -> bool:
        """Whether the container (as last listed) runs that image (None: the server's own root)."""
        info = self._containers.get(container_id)
        return info is not None and info.image_key == image_key

    async def start_one_more(
        self, known: set[str], looked_again: bool, image: BuiltImage | None = None
    ) -> ContainerInfo | Literal["appeared"] | None:
        """Start one container of `image` if this fleet may, fewer than `max_per_image` of it exist and
        fewer than `max_containers` in all (live or dead, as a dead one will be restarted), or an idle
        container of another image gives up its place. "appeared" when a container of the image not in
        `known` was started elsewhere meanwhile (unless the caller `looked_again` already); None when the
        caller should wait instead."""
        if not self.start_containers:
            return None
        key = image.key if image is not None else None
        async with self.backend.exclusive():
            live = await self.backend.list_containers()
            dead = await self.backend.dead_containers()
            mine = [info for info in live if info.image_key == key]
            if not looked_again and {info.container_id for info in mine} - known:
                return "appeared"
            of_image = sum(info.accepting for info in mine) + _count(dead, key)
            if image is not None and of_image >= self.options.max_per_image:
                return None
            if sum(info.accepting for info in live) + len(dead) >= self.options.max_containers:
                if not await self._make_room(live, key):
                    return None
            started = await self.backend.start_container(image=image)
        self._containers[started.container_id] = started
        started_now, self._started = self._started, asyncio.Event()
        started_now.set()
        log.info("every sandbox slot was taken: started container %s", started.container_id)
        return started

    def next_start(self) -> Awaitable[bool]:
        """Done when this process next starts a container."""
        return self._started.wait()

    # talking to them ---------------------------------------------------------------------

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
        fresh = SandboxClient(info.url, self.backend.token_for(info), timeout=self.options.request_timeout_s)
        self._clients[container_id] = fresh
        return fresh

    async def send(self, container_id: str, request: BaseModel) -> Any:
        """Send one request of `sandbox.requests` to a container, as `call` does."""
        return await self.call(container_id, lambda client: client.send(request))

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

    # keeping them right ------------------------------------------------------------------

    async def restart_dead(self) -> None:
        """Restart dead containers now, if there are any, as `check_health` does."""
        if self.start_containers and await self.backend.dead_containers():
            await self.check_health()

    async def check_health(self) -> HealthReport:
        """Restart dead containers in place; give up on (and report the leases of) those that cannot be."""
        report = HealthReport()
        live = await self.backend.list_containers()
        dead = await self.backend.dead_containers() if self.start_containers else []
        for info in dead:
            try:
                await self.backend.restart_container(info.container_id)
                report.restarted.append(info.container_id)
                log.info("sandbox %s had died; restarted it in place", info.container_id)
            except RegistryBusy as err:
                log.warning("cannot restart sandbox %s now: %s", info.container_id, err)
            except RolloutError as err:
                lost = await self.backend.forget_container(info.container_id)
                self._forget(info.container_id)
                report.removed.append(info.container_id)
                report.lost_leases.extend(lost)
                log.error("sandbox %s died and cannot be restarted (%s); leases lost: %s", info.container_id, err, lost)
        if report.restarted:
            live = await self.refresh()
        report.healthy = [info.container_id for info in live]
        return report

    async def scale_down(self, min_containers: int | None = None, idle_s: float | None = None) -> list[str]:
        """Stop containers that had no lease and no waiter for `idle_s`, above `min_containers` of the
        server's own root and down to none of an item image, and every retiring one (not `accepting`)
        once idle; their ids."""
        min_containers = self.options.min_containers if min_containers is None else min_containers
        idle_s = self.options.idle_stop_s if idle_s is None else idle_s
        stopped: list[str] = []
        async with self.backend.exclusive():
            listed = await self.backend.list_containers()
            self._remember(listed)
            for info in listed:
                if not info.accepting and await self._stop_if_idle(info.container_id, 0.0):
                    stopped.append(info.container_id)
            live = [info for info in listed if info.accepting]
            remaining = {key: _count(live, key) for key in {info.image_key for info in live}}
            for info in await self._idle(live, idle_s):
                if remaining[info.image_key] <= (min_containers if info.image is None else 0):
                    continue
                if await self._stop_if_idle(info.container_id, idle_s):
                    stopped.append(info.container_id)
                    remaining[info.image_key] -= 1
        if stopped:
            log.info("stopped idle sandbox containers: %s", ", ".join(stopped))
        return stopped

    async def _make_room(self, live: list[ContainerInfo], key: str | None) -> bool:
        """Stop the longest-idle container of another image (keeping `min_containers` of the server's own
        root), so one of image `key` can start within `max_containers`; whether one was stopped."""
        others = [info for info in live if info.image_key != key and info.accepting]
        plain = _count(others, None)
        for info in await self._idle(others, 0.0):
            if info.image is None and plain <= self.options.min_containers:
                continue
            if await self._stop_if_idle(info.container_id, 0.0):
                log.info("stopped idle sandbox %s to make room for image %s", info.container_id, key or "(none)")
                return True
        return False

    async def _idle(self, containers: list[ContainerInfo], idle_s: float) -> list[ContainerInfo]:
        """Those of `containers` with no lease and no waiter for `idle_s`, longest idle first."""
        healths = await asyncio.gather(*(self._health(info.container_id) for info in containers))
        now = time.time()
        idle = sorted(
            (health.idle_since, index)
            for index, health in enumerate(healths)
            if health is not None and health.idle_since is not None and now - health.idle_since >= idle_s
        )
        return [containers[index] for _, index in idle]

    async def _stop_if_idle(self, container_id: str, idle_s: float) -> bool:
        """Stop a container if its server agrees it has been idle `idle_s` (and from then on refuses leases)."""
        try:
            drained = await (await self.client(container_id)).send(DrainRequest(idle_s=idle_s))
        except SandboxUnreachable:
            return False
        if not drained.draining:
            return False
        await self.backend.stop_container(container_id)
        self._forget(container_id)
        return True

    async def _health(self, container_id: str) -> HealthStatus | None:
        try:
            return await (await self.client(container_id)).send(HealthQuery())
        except SandboxUnreachable:
            return None

    # this process's share ----------------------------------------------------------------

    def in_background(self, coroutine: Awaitable[Any]) -> asyncio.Task[Any]:
        """Run work that must finish even if its caller is cancelled (giving a lease back)."""
        task = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def aclose(self) -> None:
        if self._background:
            await asyncio.wait(set(self._background), timeout=self.options.request_timeout_s)
        clients, self._clients = list(self._clients.values()), {}
        await asyncio.gather(*(client.aclose() for client in clients))
        await self.backend.aclose()

    def _remember(self, live: list[ContainerInfo]) -> None:
        self._containers = {info.container_id: info for info in live}

    def _forget(self, container_id: str) -> None:
        self._containers.pop(container_id, None)
        if (client := self._clients.pop(container_id, None)) is not None:
            self.in_background(client.aclose())


def _count(containers: list[ContainerInfo], key: str | None) -> int:
    return sum(info.image_key == key for info in containers)
