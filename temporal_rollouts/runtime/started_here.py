"""What a command started itself, so that a command that fails stops that and nothing else.

`rollouts demo` starts the embedded server, the demo policy and a sandbox container where none runs;
when it does not finish (refused by another checkout's server, Ctrl-C, its server gone), leaving them
running would leave processes nobody asked for, and stopping what it found running would take
another command's. So it notes what ran before it began, and on failure stops the rest.
"""

from __future__ import annotations

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.services import port_open, stop_demo_policy
from temporal_rollouts.runtime.temporal import stop_dev_server
from temporal_rollouts.sandbox.backends.select import build_backend


class StartedHere:
    """What ran before a command began (the embedded server, the demo policy, sandbox containers), so a
    command that fails (`rollouts demo` refused by another checkout's server, stopped by Ctrl-C, its
    server gone) stops what it started itself, and nothing it found running."""

    def __init__(self, settings: Settings, server: bool, policy: bool, containers: set[str]) -> None:
        self._settings = settings
        self._server, self._policy, self._containers = server, policy, containers

    @classmethod
    async def note(cls, settings: Settings) -> StartedHere:
        server = settings.embedded and port_open("127.0.0.1", settings.temporal.embedded_port)
        policy = port_open(settings.demo_policy.host, settings.demo_policy.port)
        return cls(settings, server, policy, {c.container_id for c in await _containers(settings)})

    async def stop_the_rest(self) -> list[str]:
        """Stop what was started since `note`; returns what was stopped, in words."""
        stopped = []
        if self._settings.sandbox.start_containers:
            backend = build_backend(self._settings)
            try:
                for container in await backend.list_containers():
                    if container.container_id not in self._containers:
                        await backend.stop_container(container.container_id)
                        stopped.append(f"sandbox container {container.container_id}")
            finally:
                await backend.aclose()
        if not self._policy and stop_demo_policy(self._settings):
            stopped.append("the demo policy")
        if self._settings.embedded and not self._server and stop_dev_server(self._settings):
            stopped.append("the embedded Temporal server")
        return stopped


async def _containers(settings: Settings) -> list:
    if not settings.sandbox.start_containers:
        return []
    backend = build_backend(settings)
    try:
        return await backend.list_containers()
    finally:
        await backend.aclose()
