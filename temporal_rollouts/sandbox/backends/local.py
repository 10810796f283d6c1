"""LocalBackend: sandbox servers as detached processes on this machine.

Each container is `python -m temporal_rollouts.sandbox_server` in its own session, so it outlives
the worker that started it and a restarted worker finds it again through the
registry. Its directory `data_dir/sandboxes/<id>/` holds the token (mode 0600),
the server log and the slot root, whose journals let a server restarted under
the same id answer stored results and keep its leases.

A container whose process died is remembered in the registry's `dead` list until
it is restarted in place (`restart_container`, which only one process does: it
re-checks under the registry lock) or given up on (`forget_container`). A server
whose starter died before registering it (a worker killed while scaling up) is an
orphan nobody would ever stop: `list_containers` stops such servers. Starting holds
the registry lock until the server is registered, so an orphan is told apart from a
server still being started by looking again under the lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Literal

import httpx

from temporal_rollouts.core.errors import SandboxError, SandboxUnreachable
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.sandbox_backends import LocalBackendConfig
from temporal_rollouts.core.settings import SandboxSettings, Settings
from temporal_rollouts.sandbox.backends.base import ContainerInfo, ContainerState, SandboxBackend, backend_config
from temporal_rollouts.sandbox.backends.processes import server_alive, stop_process, tail, terminate
from temporal_rollouts.sandbox.backends.registry import ContainerRegistry
from temporal_rollouts.sandbox.images.builder import ImageBuilder
from temporal_rollouts.sandbox_server.state.persistence import LEASE_FILE, LeaseStore
from temporal_rollouts.sandbox_server.schema import SlotLease

log = logging.getLogger(__name__)

PROJECT_ROOT = Path(__file__).resolve().parents[3]
HEALTH_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0

Verdict = Literal["healthy", "unresponsive", "dead"]


class LocalBackend(SandboxBackend):
    name = "local"

    def __init__(
        self, data_dir: Path, sandbox: SandboxSettings | None = None, images: ImageBuilder | None = None
    ) -> None:
        """Containers under `data_dir/sandboxes`, started as `sandbox` says (the default settings if None;
        its `backend` must be the local one); `images` builds and stores item images for them (None: none)."""
        self.sandbox = sandbox if sandbox is not None else SandboxSettings()
        self.config: LocalBackendConfig = backend_config(self.sandbox, "local")
        self.directory = Path(data_dir).resolve() / "sandboxes"
        self.registry = ContainerRegistry(self.directory / "containers.json")
        self.images = images
        """Builds item images into this host's store and mounts them for servers; None: no item images."""
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalBackend:
        return cls(settings.data_dir, settings.sandbox, images=ImageBuilder.from_settings(settings))

    def container_dir(self, container_id: str) -> Path:
        return self.directory / container_id

    async def start_container(self, container_id: str | None = None, image: BuiltImage | None = None) -> ContainerInfo:
        """Start a new container, or restart a stopped one under its old id (keeping its journals, leases
        and image)."""
        container_id = container_id or f"local-{image.short + '-' if image else ''}{secrets.token_hex(4)}"
        async with self.registry.locked():
            if (known := self.registry.find(container_id)) is not None:
                verdict = await self._verdict(known)
                if verdict == "healthy":
                    return known
                if verdict == "unresponsive":
                    raise SandboxUnreachable(f"sandbox {container_id} is running but does not answer /health")
                image = known.image
            info = await self._launch(container_id, image)
            try:
                await self.registry.upsert(info)
            except BaseException:  # unregistered, nobody else could find it to stop it
                terminate(info.pid, signal.SIGKILL)
                raise
            return info

    async def restart_container(self, container_id: str) -> ContainerInfo:
        """Restart a dead container in place; if another process already did, return what it started."""
        async with self.registry.locked():
            if self.registry.find(container_id) is None:
                raise SandboxError(f"sandbox {container_id} is not registered: it was stopped, or never started")
            return await self.start_container(container_id)

    async def build_image(self, spec: ImageSpec, wanted_by: str) -> BuiltImage:
        """Build the image into this host's store (once per content), or find it there."""
        if self.images is None:
            return await super().build_image(spec, wanted_by)
        return await self.images.ready(spec, wanted_by)

    async def stop_container(self, container_id: str) -> None:
        """Unregister first (and drop the ready file), so no pool takes the stopping server for a dead one
        to restart, nor for an orphan."""
        async with self.registry.locked():
            info = self.registry.find(container_id)
            (self.container_dir(container_id) / "ready.json").unlink(missing_ok=True)
            await self.registry.remove([container_id])
        if info is not None and info.pid is not None:
            await stop_process(info.pid, container_id, self._children, STOP_TIMEOUT_S)

    async def list_containers(self) -> list[ContainerInfo]:
        """Healthy containers; entries whose process is gone move to the dead list, to be restarted in place."""
        known = self.registry.load()
        verdicts = list(zip(known, await asyncio.gather(*(self._verdict(info) for info in known)), strict=True))
        await self.registry.mark_dead(info for info, verdict in verdicts if verdict == "dead")
        if self._orphans():
            await self._stop_orphans()
        return [info for info, verdict in verdicts if verdict == "healthy"]

    def _orphans(self) -> list[tuple[str, int]]:
        """(container id, pid) of running servers in our directory that the registry does not list."""
        known = {info.container_id for info in [*self.registry.load(), *self.registry.dead()]}
        found = []
        for ready_file in self.directory.glob("*/ready.json"):
            try:
                ready = json.loads(ready_file.read_text(encoding="utf-8"))
                container_id, pid = str(ready["container_id"]), int(ready["pid"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if container_id not in known and server_alive(pid, container_id, self._children):
                found.append((container_id, pid))
        return found

    async def _stop_orphans(self) -> None:
        async with self.registry.locked():
            orphans = self._orphans()
            for container_id, _ in orphans:
                (self.container_dir(container_id) / "ready.json").unlink(missing_ok=True)
        for container_id, pid in orphans:
            log.warning("stopping sandbox %s (pid %d): its starter died before registering it", container_id, pid)
            await stop_process(pid, container_id, self._children, STOP_TIMEOUT_S)

    async def container_state(self, container_id: str) -> ContainerState:
        info = self.registry.find(container_id)
        return "unknown" if info is None else await self._verdict(info)

    async def dead_containers(self) -> list[ContainerInfo]:
        """As last seen by `list_containers` (which moves a container here when its process is gone)."""
        return self.registry.dead()

    async def forget_container(self, container_id: str) -> list[SlotLease]:
        """Unregister a container that cannot be restarted; the leases it had persisted are lost."""
        await self.stop_container(container_id)
        stored = LeaseStore(self.container_dir(container_id) / "root" / LEASE_FILE).load()
        return [entry.lease for entry in stored]

    def exclusive(self) -> contextlib.AbstractAsyncContextManager[None]:
        return self.registry.locked()

    async def _launch(self, container_id: str, image: BuiltImage | None) -> ContainerInfo:
        on_image = await self._image_options(image) if image is not None else {}
        directory = self.container_dir(container_id)
        directory.mkdir(parents=True, exist_ok=True)
        token_file = directory / "token"
        _ensure_token(token_file)
        ready_file = directory / "ready.json"
        ready_file.unlink(missing_ok=True)
        process = self._spawn_server(container_id, directory, token_file, ready_file, on_image)
        try:  # until it is registered nobody else can find it to stop it, so a start given up stops it here
            ready = await self._wait_until_ready(process, ready_file, directory / "server.log")
            info = ContainerInfo(
                container_id=container_id,
                url=ready["url"],
                pid=process.pid,
                backend=self.name,
                token_file=token_file,
                started_at=time.time(),
                image=image,
            )
            if await self._verdict(info) != "healthy":
                raise SandboxUnreachable(f"sandbox {container_id} wrote its ready file but /health does not answer")
        except BaseException:  # failed, or cancelled (Ctrl-C in `rollouts demo` while its sandbox starts)
            terminate(process.pid, signal.SIGKILL)
            raise
        return info

    async def _verdict(self, info: ContainerInfo) -> Verdict:
        process_known = info.pid is not None
        if info.pid is not None and not server_alive(info.pid, info.container_id, self._children):
            return "dead"
        try:
            # Plain HTTP on this machine: verify=False only skips loading the CA bundle (~30 ms a probe).
            async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT_S, verify=False) as http:
                reply = await http.get(f"{info.url}/health")
        except httpx.TimeoutException:
            return "unresponsive"
        except httpx.TransportError:
            return "unresponsive" if process_known else "dead"
        try:
            answered_id = reply.json().get("container_id") if reply.is_success else None
        except ValueError:
            answered_id = None
        if answered_id == info.container_id:
            return "healthy"
        return "unresponsive" if process_known else "dead"

    async def _image_options(self, image: BuiltImage) -> dict[str, Any]:
        """What a server running its slots on `image` is given: the image's layer folders in this host's
        store, topmost first, its WORKDIR and ENV (`sandbox_server.files.image_root`)."""
        if self.images is None:
            raise SandboxError(f"this local backend has no image store for image {image.name}")
        return {
            "image_layers": await self.images.store.layers(image.name),
            "image_workdir": image.config.workdir,
            "image_env": list(image.config.env),
            "image_name": image.name,
        }

    def _spawn_server(
        self, container_id: str, directory: Path, token_file: Path, ready_file: Path, on_image: dict[str, Any]
    ) -> subprocess.Popen[bytes]:
        config = self.sandbox.for_container(
            root=directory / "root",
            container_id=container_id,
            host=self.config.host,
            port=0,
            token_file=token_file,
            ready_file=ready_file,
            **on_image,
        )
        argv = [sys.executable, "-m", "temporal_rollouts.sandbox_server", *config.argv()]
        if not config.require_isolation:
            log.warning("starting sandbox %s with require_isolation off: commands may run UNISOLATED", container_id)
        env = server_environment()
        with (directory / "server.log").open("ab") as log_file:
            process = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                cwd=directory,
                env=env,
                start_new_session=True,
            )
        self._children[process.pid] = process
        return process

    async def _wait_until_ready(self, process: subprocess.Popen[bytes], ready_file: Path, log_path: Path) -> dict:
        deadline = time.monotonic() + self.config.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SandboxError(
                    f"sandbox server exited with status {process.returncode} while starting; "
                    f"{log_path} ends with:\n{tail(log_path)}"
                )
            if ready_file.exists():
                return json.loads(ready_file.read_text(encoding="utf-8"))
            await asyncio.sleep(0.05)
        terminate(process.pid, signal.SIGKILL)
        raise SandboxUnreachable(
            f"sandbox server did not start within {self.config.start_timeout_s:g}s; see {log_path}"
        )


SERVER_ENV_KEEP = ("PATH", "LANG", "LC_ALL", "TZ", "TMPDIR")


def server_environment() -> dict[str, str]:
    """The sandbox server's whole environment: what it needs to run, none of the worker's secrets
    (API keys, cloud credentials, tokens) that a slot could otherwise find."""
    env = {key: os.environ[key] for key in SERVER_ENV_KEEP if key in os.environ}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env["PYTHONPATH"] = str(PROJECT_ROOT)
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _ensure_token(token_file: Path) -> None:
    if token_file.exists():
        return
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(secrets.token_urlsafe(32))
