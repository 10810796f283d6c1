"""The file that lists the sandbox containers a backend started on this machine.

Workers come and go while containers keep running, so the list lives in a JSON
file shared by every worker process on the machine. Every write replaces the file
atomically, so readers never see half of it and need no lock. Decisions that read,
then act, then write (start one more container, restart a dead one, stop an idle
one) hold `locked()`: an flock across processes, taken without blocking the event
loop, reentrant within the task that holds it, and given up after a timeout so a
hung process cannot stall every rollout on the machine.

Besides the live containers, the file remembers the ones whose process died
(`dead`): their directories still hold persisted leases, stored results and
workspaces, so the pool restarts them in place under the same id. A container
stopped on purpose is removed altogether.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import time
import weakref
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pydantic import ValidationError

from temporal_rollouts.core.errors import SandboxUnreachable
from temporal_rollouts.sandbox.backends.base import ContainerInfo
from temporal_rollouts.sandbox_server.state.persistence import write_json_atomically

log = logging.getLogger(__name__)

LOCK_TIMEOUT_S = 90.0
LOCK_POLL_S = 0.02


class RegistryBusy(SandboxUnreachable):
    """The registry lock stayed taken past the timeout: try again later; nothing is wrong with a container."""


@dataclass
class _Hold:
    """This process's hold on one lock file, per event loop (an asyncio.Lock belongs to one loop)."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    owner: asyncio.Task[Any] | None = None


_HOLDS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[Path, _Hold]] = weakref.WeakKeyDictionary()


class ContainerRegistry:
    def __init__(self, path: Path, lock_timeout_s: float = LOCK_TIMEOUT_S) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")
        self.lock_timeout_s = lock_timeout_s

    def load(self) -> list[ContainerInfo]:
        """The live containers (their process was running when last seen)."""
        return self._read()[0]

    def dead(self) -> list[ContainerInfo]:
        """Containers whose process died, waiting to be restarted in place or forgotten."""
        return self._read()[1]

    def get(self, container_id: str) -> ContainerInfo | None:
        return next((info for info in self.load() if info.container_id == container_id), None)

    def find(self, container_id: str) -> ContainerInfo | None:
        """A live or dead container by id; None when it was never started or was stopped on purpose."""
        live, dead = self._read()
        return next((info for info in [*live, *dead] if info.container_id == container_id), None)

    async def upsert(self, info: ContainerInfo) -> None:
        async with self.locked():
            live, dead = self._read()
            self._save([*_without(live, {info.container_id}), info], _without(dead, {info.container_id}))

    async def remove(self, container_ids: Iterable[str]) -> None:
        dropped = set(container_ids)
        if dropped:
            async with self.locked():
                live, dead = self._read()
                self._save(_without(live, dropped), _without(dead, dropped))

    async def mark_dead(self, judged: Iterable[ContainerInfo]) -> None:
        """Move containers judged dead to the dead list, unless their entry changed since
        they were judged: a container another task restarted in place meanwhile (a new
        pid under the same id) is alive and stays."""
        stale = {(info.container_id, info.pid, info.started_at) for info in judged}
        if stale:
            async with self.locked():
                live, dead = self._read()
                newly = [info for info in live if (info.container_id, info.pid, info.started_at) in stale]
                moved = {info.container_id for info in newly}
                self._save(_without(live, moved), [*_without(dead, moved), *newly])

    @contextlib.asynccontextmanager
    async def locked(self) -> AsyncIterator[None]:
        """Hold the registry lock (see the module docstring); raises SandboxUnreachable after the timeout."""
        hold = _HOLDS.setdefault(asyncio.get_running_loop(), {}).setdefault(self.lock_path.resolve(), _Hold())
        task = asyncio.current_task()
        if task is not None and hold.owner is task:
            yield
            return
        try:
            await asyncio.wait_for(hold.lock.acquire(), self.lock_timeout_s)
        except TimeoutError:
            raise RegistryBusy(f"the container registry lock {self.lock_path} stayed busy") from None
        try:
            lock_file = await self._flock()
            hold.owner = task
            try:
                yield
            finally:
                hold.owner = None
                fcntl.flock(lock_file, fcntl.LOCK_UN)
                lock_file.close()
        finally:
            hold.lock.release()

    async def _flock(self) -> IO[str]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        lock_file = self.lock_path.open("a")
        deadline = time.monotonic() + self.lock_timeout_s
        try:
            while True:
                try:
                    fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    return lock_file
                except BlockingIOError:
                    pass
                if time.monotonic() > deadline:
                    raise RegistryBusy(f"another process held the container registry lock {self.lock_path}")
                await asyncio.sleep(LOCK_POLL_S)
        except BaseException:
            lock_file.close()
            raise

    def _read(self) -> tuple[list[ContainerInfo], list[ContainerInfo]]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return (
                [ContainerInfo.model_validate(item) for item in raw.get("containers", [])],
                [ContainerInfo.model_validate(item) for item in raw.get("dead", [])],
            )
        except FileNotFoundError:
            return [], []
        except (ValueError, AttributeError, ValidationError) as err:
            log.warning("container registry %s is unreadable (%s); treating it as empty", self.path, err)
            return [], []

    def _save(self, live: list[ContainerInfo], dead: list[ContainerInfo]) -> None:
        write_json_atomically(
            self.path,
            {
                "containers": [info.model_dump(mode="json") for info in live],
                "dead": [info.model_dump(mode="json") for info in dead],
            },
        )


def _without(infos: list[ContainerInfo], ids: set[str]) -> list[ContainerInfo]:
    return [info for info in infos if info.container_id not in ids]
