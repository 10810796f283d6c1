"""Helpers shared by the sandbox tests: process scans, execution logs, real servers."""

from __future__ import annotations

import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import pytest

from temporal_rollouts.core.settings import PoolOptions, SandboxSettings
from temporal_rollouts.sandbox.backends.base import ContainerInfo
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox_server.config import ServerOptions
from temporal_rollouts.sandbox_server.isolation.bubblewrap import bubblewrap_path
from temporal_rollouts.sandbox_server.schema import ExecuteRequest, Holder, Operation, ReleaseRequest, SlotRef
from tests.support import REPO

needs_bubblewrap = pytest.mark.skipif(bubblewrap_path() is None, reason="bubblewrap cannot build a sandbox here")

ONE_CONTAINER = PoolOptions(max_containers=1)
"""A test pool that never starts a second container (a pool's default is the settings' own)."""


def sandbox_settings(server: ServerOptions | None = None, **fields: Any) -> SandboxSettings:
    """A test backend's `[sandbox]` settings: `server`'s options (the defaults if None), `fields` over them."""
    return SandboxSettings(**{**(server or ServerOptions()).model_dump(), **fields})


def unique_sleep() -> str:
    """A sleep duration no other process on the host uses, to find leftovers by their command line."""
    return f"{random.randint(1000, 9999)}.{random.randint(100000, 999999)}"


def processes_running(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in cmdline and state != "Z":
            found.append(int(entry.name))
    return found


def execution_log(container_root: Path) -> list[dict]:
    path = container_root / "executions.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def executions_under(folder: Path, prefix: str) -> list[dict]:
    """Every operation any sandbox server under `folder` really ran whose call id starts with `prefix`."""
    found = []
    # Logs sit at a server's root, never in a slot: skip the slots, whose trees the server deletes while we walk
    # (os.walk, unlike rglob, also passes over a folder that vanishes under it).
    for parent, folders, files in os.walk(folder):
        folders[:] = [name for name in folders if not name.startswith("slot-")]
        if "executions.jsonl" in files:
            entries = execution_log(Path(parent))
            found += [entry for entry in entries if entry["call_id"].startswith(prefix)]
    return found


def runs_of(container_root: Path, call_id: str) -> int:
    return sum(entry["call_id"] == call_id for entry in execution_log(container_root))


@contextmanager
def host_listener() -> Iterator[int]:
    """A TCP port listening on the host's 127.0.0.1 (connections queue in the backlog)."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as server:
        yield server.getsockname()[1]


async def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    import asyncio

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval_s)
    return predicate()


def workspace_of(backend: LocalBackend, container_id: str, slot: int) -> Path:
    """A slot's workspace as its server sees it: a server that mounts each slot's volume does so in a mount
    namespace of its own, so the host reaches it through the server's root (/proc/PID/root)."""
    path = backend.container_dir(container_id) / "root" / f"slot-{slot}" / "volume" / "workspace"
    info = backend.registry.find(container_id)
    if info is not None and info.pid is not None and os.path.exists(f"/proc/{info.pid}/root"):
        return Path(f"/proc/{info.pid}/root{path}")
    return path


def root_of(backend: LocalBackend, container_id: str) -> Path:
    return backend.container_dir(container_id) / "root"


@asynccontextmanager
async def local_backend(
    folder: Path, slots: int, backend_class: type[LocalBackend] = LocalBackend
) -> AsyncIterator[LocalBackend]:
    """A local sandbox backend in a test's own folder; every container it registered is stopped at the end."""
    backend = backend_class(folder, sandbox_settings(slots_per_container=slots, sweep_interval_s=0.3))
    try:
        yield backend
    finally:
        for info in backend.registry.load():
            await backend.stop_container(info.container_id)


@asynccontextmanager
async def running_container(backend: LocalBackend) -> AsyncIterator[tuple[ContainerInfo, SandboxClient]]:
    info = await backend.start_container()
    client = SandboxClient(info.url, info.read_token(), timeout=10.0)
    try:
        yield info, client
    finally:
        await client.aclose()
        await backend.stop_container(info.container_id)


async def eventually(check: Callable[[], Awaitable[bool]], timeout_s: float = 5.0, interval_s: float = 0.05) -> bool:
    """Poll an async condition until it holds (tests only: the code under test never polls)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await check():
            return True
        await asyncio.sleep(interval_s)
    return await check()


def holder(name: str) -> Holder:
    return Holder(workflow_id=f"{name}-{random.randint(0, 1 << 30):x}", run_id="run")


def execute_in(lease: SlotRef, call_id: str, operation: Operation) -> ExecuteRequest:
    """The request that runs `operation` in the lease's slot, for tests that talk to one server."""
    return ExecuteRequest(slot=lease.slot, lease_id=lease.lease_id, call_id=call_id, operation=operation)


def release_of(lease: SlotRef) -> ReleaseRequest:
    return ReleaseRequest(slot=lease.slot, lease_id=lease.lease_id)


def spawn_waiting_client(info: ContainerInfo, workflow_id: str, wait_s: float = 60.0) -> subprocess.Popen[bytes]:
    """Another process that waits in line for a slot; kill it to play a worker that died mid-wait."""
    script = (
        "import asyncio, sys\n"
        "from temporal_rollouts.sandbox.client import SandboxClient\n"
        "from temporal_rollouts.sandbox_server.schema import AcquireRequest, Holder\n"
        "async def main():\n"
        "    async with SandboxClient(sys.argv[1], open(sys.argv[2]).read().strip()) as client:\n"
        "        holder = Holder(workflow_id=sys.argv[3])\n"
        "        await client.send(AcquireRequest(holder=holder, ttl_s=60, wait_s=float(sys.argv[4])))\n"
        "asyncio.run(main())\n"
    )
    argv = [sys.executable, "-c", script, info.url, str(info.token_file), workflow_id, str(wait_s)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(argv, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def fork_bomb(marker: str) -> str:
    """Fork up to 5,000 children that each sleep `marker` seconds, printing how many it got."""
    return (
        "import os, sys\n"
        "n = 0\n"
        "try:\n"
        "    while n < 5000:\n"
        "        if os.fork() == 0:\n"
        f"            os.execvp('sleep', ['sleep', '{marker}'])\n"
        "        n += 1\n"
        "except OSError as err:\n"
        "    print('stopped after', n, err)\n"
        "print('forked', n)\n"
    )
