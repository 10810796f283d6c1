"""What the backends whose servers live elsewhere share (static, nomad, modal): each server's token
derived from the pool secret, health asked over one kept-alive client, and the pool settings every
server they start is given."""

from __future__ import annotations


import httpx

from temporal_rollouts.core.settings import SandboxSettings
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


class RemoteBackend(SandboxBackend):
    """A backend whose servers present tokens derived from the pool secret."""

    def __init__(self, sandbox: SandboxSettings, secret: PoolSecret) -> None:
        self.sandbox = sandbox
        self.secret = secret
        self.probe = HealthProbe()

    def token_for(self, info: ContainerInfo) -> str:
        return self.secret.token(info.container_id)

    async def aclose(self) -> None:
        await self.probe.aclose()
