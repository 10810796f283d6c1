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

import httpx

from temporal_rollouts.core.errors import ConfigError, SandboxError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.base import ContainerInfo, ContainerState, SandboxBackend
from temporal_rollouts.sandbox.backends.tokens import PoolSecret

HEALTH_TIMEOUT_S = 5.0


class HealthProbe:
    """Asks `url/health` whether a container answers as itself, over one kept-alive HTTP client (a new
    client per probe costs tens of milliseconds of TLS setup, paid on every listing, so every acquire)."""

    def __init__(self, timeout_s: float = HEALTH_TIMEOUT_S) -> None:
        self.timeout_s = timeout_s
        self._http: httpx.AsyncClient | None = None

    async def __call__(self, url: str, container_id: str) -> ContainerState:
        """healthy when it answers with this container id; unresponsive when something else or nothing
        answers (the server may be restarting: not ours to judge dead)."""
        if self._http is None:
            self._http = httpx.AsyncClient(timeout=self.timeout_s)
        try:
            reply = await self._http.get(f"{url.rstrip('/')}/health")
            answered = reply.json().get("container_id") if reply.is_success else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return "unresponsive"
        return "healthy" if answered == container_id else "unresponsive"

    async def aclose(self) -> None:
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()


class StaticBackend(SandboxBackend):
    name = "static"

    def __init__(self, servers: dict[str, str], secret: PoolSecret) -> None:
        if not servers:
            raise ConfigError("the static sandbox backend needs at least one server")
        self.servers = {container_id: url.rstrip("/") for container_id, url in servers.items()}
        self.secret = secret
        self.probe = HealthProbe()
        self._started_at = time.time()

    @classmethod
    def from_settings(cls, settings: Settings) -> StaticBackend:
        config = settings.sandbox.backend
        if config.type != "static":
            raise ConfigError(f"sandbox.backend is {config.type!r}, not 'static'")
        ids = [server.container_id for server in config.servers]
        if len(set(ids)) != len(ids):
            raise ConfigError(f"sandbox.backend.servers repeats a container id: {ids}")
        return cls({server.container_id: server.url for server in config.servers}, PoolSecret.from_env(config.secret_env))

    def token_for(self, info: ContainerInfo) -> str:
        return self.secret.token(info.container_id)

    def _info(self, container_id: str) -> ContainerInfo:
        return ContainerInfo(
            container_id=container_id, url=self.servers[container_id], backend=self.name, started_at=self._started_at
        )

    async def start_container(self, container_id: str | None = None) -> ContainerInfo:
        if container_id is not None and container_id in self.servers:
            if await self.probe(self.servers[container_id], container_id) == "healthy":
                return self._info(container_id)
        raise SandboxError("the static sandbox backend cannot start containers: whoever runs the servers does")

    async def stop_container(self, container_id: str) -> None:
        """Nothing to do: the servers belong to whoever runs them."""

    async def shutdown(self, purge: bool | None = None) -> list[str]:
        return []

    async def aclose(self) -> None:
        await self.probe.aclose()

    async def list_containers(self) -> list[ContainerInfo]:
        ids = list(self.servers)
        states = await asyncio.gather(*(self.probe(self.servers[i], i) for i in ids))
        return [self._info(i) for i, state in zip(ids, states, strict=True) if state == "healthy"]

    async def container_state(self, container_id: str) -> ContainerState:
        if container_id not in self.servers:
            return "unknown"
        return await self.probe(self.servers[container_id], container_id)
