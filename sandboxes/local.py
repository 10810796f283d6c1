"""LocalBackend: sandbox servers as detached processes on this machine.

Each container is `python -m sandboxes.server` in its own session, so it outlives
the worker that started it and a restarted worker finds it again through the
registry. Its directory `data_dir/sandboxes/<id>/` holds the token (mode 0600),
the server log and the slot root, whose journals let a server restarted under
the same id answer stored results.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from rollouts.errors import SandboxError, SandboxUnreachable
from rollouts.settings import Settings
from sandboxes.backend import ContainerInfo, SandboxBackend
from sandboxes.registry import ContainerRegistry

PROJECT_ROOT = Path(__file__).resolve().parents[1]
HEALTH_TIMEOUT_S = 5.0
STOP_TIMEOUT_S = 10.0
LOG_TAIL_CHARS = 2_000


class LocalBackend(SandboxBackend):
    name = "local"

    def __init__(
        self,
        data_dir: Path,
        slots_per_container: int = 8,
        host: str = "127.0.0.1",
        require_isolation: bool = False,
        max_output_chars: int = 50_000,
        start_timeout_s: float = 30.0,
        sweep_interval_s: float = 2.0,
    ) -> None:
        self.directory = Path(data_dir).resolve() / "sandboxes"
        self.slots_per_container = slots_per_container
        self.host = host
        self.require_isolation = require_isolation
        self.max_output_chars = max_output_chars
        self.start_timeout_s = start_timeout_s
        self.sweep_interval_s = sweep_interval_s
        self.registry = ContainerRegistry(self.directory / "containers.json")
        self._children: dict[int, subprocess.Popen[bytes]] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> LocalBackend:
        sandbox = settings.sandbox
        return cls(
            settings.data_dir,
            slots_per_container=sandbox.slots_per_container,
            host=sandbox.host,
            require_isolation=sandbox.require_isolation,
            max_output_chars=sandbox.max_output_chars,
        )

    def container_dir(self, container_id: str) -> Path:
        return self.directory / container_id

    async def start_container(self, container_id: str | None = None) -> ContainerInfo:
        """Start a new container, or restart a stopped one under its old id (keeping its journals)."""
        container_id = container_id or f"local-{secrets.token_hex(4)}"
        if (known := self.registry.get(container_id)) is not None:
            verdict = await self._verdict(known)
            if verdict == "healthy":
                return known
            if verdict == "busy":
                raise SandboxUnreachable(f"sandbox {container_id} is running but does not answer /health")
        directory = self.container_dir(container_id)
        directory.mkdir(parents=True, exist_ok=True)
        token_file = directory / "token"
        _ensure_token(token_file)
        ready_file = directory / "ready.json"
        ready_file.unlink(missing_ok=True)
        process = self._spawn_server(container_id, directory, token_file, ready_file)
        ready = await self._wait_until_ready(process, ready_file, directory / "server.log")
        info = ContainerInfo(
            container_id=container_id,
            url=ready["url"],
            pid=process.pid,
            backend=self.name,
            token_file=token_file,
            started_at=time.time(),
        )
        if await self._verdict(info) != "healthy":
            _terminate(process.pid, signal.SIGKILL)
            raise SandboxUnreachable(f"sandbox {container_id} wrote its ready file but /health does not answer")
        self.registry.upsert(info)
        return info

    async def stop_container(self, container_id: str) -> None:
        info = self.registry.get(container_id)
        if info is not None and info.pid is not None:
            _terminate(info.pid, signal.SIGTERM)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while self._alive(info.pid) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            if self._alive(info.pid):
                _terminate(info.pid, signal.SIGKILL)
                while self._alive(info.pid) and time.monotonic() < deadline + 2:
                    await asyncio.sleep(0.05)
        self.registry.remove([container_id])

    async def list_containers(self) -> list[ContainerInfo]:
        """Healthy containers; entries whose process is gone or whose port answers for another are dropped."""
        known = self.registry.load()
        verdicts = list(zip(known, await asyncio.gather(*(self._verdict(info) for info in known)), strict=True))
        self.registry.remove(info.container_id for info, verdict in verdicts if verdict == "gone")
        return [info for info, verdict in verdicts if verdict == "healthy"]

    async def _verdict(self, info: ContainerInfo) -> str:
        if info.pid is not None and not self._alive(info.pid):
            return "gone"
        try:
            async with httpx.AsyncClient(timeout=HEALTH_TIMEOUT_S) as http:
                reply = await http.get(f"{info.url}/health")
        except httpx.TimeoutException:
            return "busy"
        except httpx.TransportError:
            return "gone"
        try:
            answered_id = reply.json().get("container_id") if reply.is_success else None
        except ValueError:
            answered_id = None
        return "healthy" if answered_id == info.container_id else "gone"

    def _spawn_server(
        self, container_id: str, directory: Path, token_file: Path, ready_file: Path
    ) -> subprocess.Popen[bytes]:
        argv = [
            sys.executable, "-m", "sandboxes.server",
            "--host", self.host,
            "--port", "0",
            "--slots", str(self.slots_per_container),
            "--root", str(directory / "root"),
            "--token-file", str(token_file),
            "--container-id", container_id,
            "--max-output-chars", str(self.max_output_chars),
            "--sweep-interval", str(self.sweep_interval_s),
            "--ready-file", str(ready_file),
        ]  # fmt: skip
        if self.require_isolation:
            argv.append("--require-isolation")
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PROJECT_ROOT), env.get("PYTHONPATH")]))
        with (directory / "server.log").open("ab") as log_file:
            process = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT,
                cwd=directory, env=env, start_new_session=True,
            )  # fmt: skip
        self._children[process.pid] = process
        return process

    async def _wait_until_ready(self, process: subprocess.Popen[bytes], ready_file: Path, log_path: Path) -> dict:
        deadline = time.monotonic() + self.start_timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise SandboxError(
                    f"sandbox server exited with status {process.returncode} while starting; "
                    f"{log_path} ends with:\n{_tail(log_path)}"
                )
            if ready_file.exists():
                return json.loads(ready_file.read_text(encoding="utf-8"))
            await asyncio.sleep(0.05)
        _terminate(process.pid, signal.SIGKILL)
        raise SandboxUnreachable(f"sandbox server did not start within {self.start_timeout_s:g}s; see {log_path}")

    def _alive(self, pid: int) -> bool:
        if (child := self._children.get(pid)) is not None:
            return child.poll() is None
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except FileNotFoundError:
            return False
        except OSError:
            return _signalable(pid)
        return state not in ("Z", "X")


def _ensure_token(token_file: Path) -> None:
    if token_file.exists():
        return
    fd = os.open(token_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as file:
        file.write(secrets.token_urlsafe(32))


def _terminate(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _tail(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"
