"""StaticBackend: a fixed set of sandbox servers that something else runs.

Kubernetes, the compose stack or a person starts the servers (each with
`--container-id ID --token-env VAR`, VAR holding HMAC(pool secret, ID)); the
configured list is the whole registry, so every worker host sees the same pool
and any worker can serve any step. The pool never starts, restarts or stops one:
whoever runs them restarts a crashed server, and a server's journals on its own
disk keep its leases and stored results across that restart.
"""

from __future__ import annotations

import asyncio
import time

from temporal_rollouts.core.errors import ConfigError, SandboxError
from temporal_rollouts.core.images import BuiltImage
from temporal_rollouts.core.sandbox_backends import StaticBackendConfig
from temporal_rollouts.core.settings import SandboxSettings, Settings
from temporal_rollouts.sandbox.backends.base import ContainerInfo, ContainerState, backend_config
from temporal_rollouts.sandbox.backends.remote import RemoteBackend
from temporal_rollouts.sandbox.backends.tokens import PoolSecret


class StaticBackend(RemoteBackend):
    name = "static"

    def __init__(self, sandbox: SandboxSettings, secret: PoolSecret) -> None:
        config: StaticBackendConfig = backend_config(sandbox, "static")
        ids = [server.container_id for server in config.servers]
        if not ids:
            raise ConfigError("the static sandbox backend needs at least one server")
        if len(set(ids)) != len(ids):
            raise ConfigError(f"sandbox.backend.servers repeats a container id: {ids}")
        super().__init__(sandbox, secret)
        self.servers = {server.container_id: server.url.rstrip("/") for server in config.servers}
        self._started_at = time.time()

    @classmethod
    def from_settings(cls, settings: Settings) -> StaticBackend:
        config = backend_config(settings.sandbox, "static")
        return cls(settings.sandbox, PoolSecret.from_env(config.secret_env))

    def _info(self, container_id: str) -> ContainerInfo:
        return ContainerInfo(
            container_id=container_id, url=self.servers[container_id], backend=self.name, started_at=self._started_at
        )

    async def start_container(self, container_id: str | None = None, image: BuiltImage | None = None) -> ContainerInfo:
        if image is None and container_id is not None and container_id in self.servers:
            if await self.probe(self.servers[container_id], container_id) == "healthy":
                return self._info(container_id)
        raise SandboxError("the static sandbox backend cannot start containers: whoever runs the servers does")

    async def stop_container(self, container_id: str) -> None:
        """Nothing to do: the servers belong to whoever runs them."""

    async def shutdown(self, purge: bool | None = None) -> list[str]:
        return []

    async def list_containers(self) -> list[ContainerInfo]:
        ids = list(self.servers)
        states = await asyncio.gather(*(self.probe(self.servers[i], i) for i in ids))
        return [self._info(i) for i, state in zip(ids, states, strict=True) if state == "healthy"]

    async def container_state(self, container_id: str) -> ContainerState:
        if container_id not in self.servers:
            return "unknown"
        return await self.probe(self.servers[container_id], container_id)
