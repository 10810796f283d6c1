"""Where sandbox containers run, behind one interface the pool uses.

A container is one sandbox server process with its slots; a backend starts,
stops and lists them (today locally, later e.g. on a cluster). Beyond that, a
backend may be able to restart a dead container in place (same id, same stored
state) and to lock scaling decisions across every process that shares it; the
defaults here say it cannot, and the pool copes.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel

from temporal_rollouts.core.errors import ConfigError, SandboxError
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.settings import SandboxSettings
from temporal_rollouts.sandbox_server.schema import SlotLease

ContainerState = Literal["healthy", "unresponsive", "dead", "unknown"]
"""healthy: answers /health; unresponsive: its process runs but does not answer; dead: its process
is gone but it is remembered, to be restarted in place; unknown: never started here, or stopped."""


class ContainerInfo(BaseModel):
    container_id: str
    url: str
    pid: int | None = None
    backend: str
    token_file: Path | None = None
    """Local backend only: the 0600 file holding the token; remote backends derive tokens instead."""
    started_at: float
    accepting: bool = True
    """False while it drains before its backend ends it (Modal's lifetime): holders keep their leases,
    new leases go elsewhere, and upkeep stops it once idle."""
    image: BuiltImage | None = None
    """The item image its slots run on; None: the server's own root (items that name no image)."""

    @property
    def image_key(self) -> str | None:
        """What rollouts are matched to it by: its image's key, None for the server's own root."""
        return self.image.key if self.image is not None else None

    def read_token(self) -> str:
        if self.token_file is None:
            raise SandboxError(f"sandbox {self.container_id} has no token file: ask its backend (token_for)")
        return self.token_file.read_text(encoding="utf-8").strip()


class SandboxBackend(ABC):
    name: ClassVar[str]
    sandbox: SandboxSettings
    """The `[sandbox]` settings it was built from, whole: its own config (`sandbox.backend`) and what every
    server it starts is given (`ServerOptions`: slots per container, isolation, limits, caps)."""

    @property
    def slots_per_container(self) -> int:
        return self.sandbox.slots_per_container

    @property
    def start_containers(self) -> bool:
        """Whether a pool over it may start and restart containers (never for `static`)."""
        return self.sandbox.start_containers

    @abstractmethod
    async def start_container(self, container_id: str | None = None, image: BuiltImage | None = None) -> ContainerInfo:
        """Start one sandbox server (or restart a stopped one under its old id) and return once it answers;
        with `image`, its slots run on that image (made ready by `build_image`)."""

    @abstractmethod
    async def stop_container(self, container_id: str) -> None:
        """Stop a container; stopping one that is already gone is not an error."""

    @abstractmethod
    async def list_containers(self) -> list[ContainerInfo]:
        """The containers that are running and healthy now."""

    def token_for(self, info: ContainerInfo) -> str:
        """The bearer token of a container: by default the one in its token file."""
        return info.read_token()

    async def build_image(self, spec: ImageSpec, wanted_by: str) -> BuiltImage:
        """Make the image `spec` names ready for this backend's containers (build it, or find it built);
        `wanted_by` names what asks, for errors. By default a backend runs no item images."""
        raise ConfigError(
            f"the {self.name} sandbox backend cannot run item images ({wanted_by} names {spec.describe()}): "
            "use the local, nomad or modal backend"
        )

    async def aclose(self) -> None:
        """Close what the backend keeps open (HTTP clients); the containers keep running."""

    async def prepare(self) -> None:
        """Called once when a worker starts, before it uses the pool: check access, clean up leftovers."""

    async def shutdown(self, purge: bool | None = None) -> list[str]:
        """Stop every container of this pool (`rollouts server stop`); the ids stopped."""
        stopped = []
        for info in [*await self.list_containers(), *await self.dead_containers()]:
            await self.stop_container(info.container_id)
            stopped.append(info.container_id)
        return stopped

    async def container_state(self, container_id: str) -> ContainerState:
        live = {info.container_id for info in await self.list_containers()}
        return "healthy" if container_id in live else "unknown"

    async def dead_containers(self) -> list[ContainerInfo]:
        """Containers whose process died (as last seen by `list_containers`), to be restarted in place."""
        return []

    async def restart_container(self, container_id: str) -> ContainerInfo:
        """Restart a dead container in place; only one process does it, the others get its result."""
        raise SandboxError(f"the {self.name} backend cannot restart container {container_id} in place")

    async def forget_container(self, container_id: str) -> list[SlotLease]:
        """Give up on a container that cannot be restarted; the leases it held, now lost."""
        await self.stop_container(container_id)
        return []

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        """A lock for read-decide-act steps (start one more, stop an idle one) shared by every process
        that manages these containers; by default only this process's tasks are excluded."""
        return self._local_exclusive()

    @contextlib.asynccontextmanager
    async def _local_exclusive(self) -> AsyncIterator[None]:
        lock = self.__dict__.setdefault("_exclusive_lock", asyncio.Lock())
        async with lock:
            yield


def backend_config(sandbox: SandboxSettings, kind: str) -> Any:
    """The `sandbox.backend` config, which must be of this kind."""
    config = sandbox.backend
    if config.type != kind:
        raise ConfigError(f"sandbox.backend is {config.type!r}, not {kind!r}")
    return config
