"""Process checks for local sandbox servers: is this pid still our server, and how to stop it.

A pid in the registry may outlive its server and be reused by an unrelated process;
restarting a container in place while its old server still runs would put two
servers on one directory, and signalling a reused pid would hit a stranger. So a
server counts as alive only while its pid runs with that container's command line.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import time
from pathlib import Path

LOG_TAIL_CHARS = 2_000


def server_alive(pid: int, container_id: str, children: dict[int, subprocess.Popen[bytes]]) -> bool:
    """Whether `pid` is still the server of `container_id`. A killed server whose main thread is a
    zombie counts as dead at once, although its other threads may take a moment longer to go."""
    child = children.get(pid)
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except FileNotFoundError:
        return child is not None and child.poll() is None
    except (OSError, IndexError):
        return child.poll() is None if child is not None else signalable(pid)
    if state in ("Z", "X"):
        if child is not None:
            child.poll()
        return False
    if child is not None:
        return child.poll() is None
    return any(part == b"temporal_rollouts.sandbox_server" for part in cmdline) and container_id.encode() in cmdline


async def stop_process(
    pid: int, container_id: str, children: dict[int, subprocess.Popen[bytes]], timeout_s: float
) -> None:
    """SIGTERM, then SIGKILL once `timeout_s` has passed; returns once it is gone (or 2s after the kill)."""
    if not server_alive(pid, container_id, children):
        return
    terminate(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while server_alive(pid, container_id, children) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    if server_alive(pid, container_id, children):
        terminate(pid, signal.SIGKILL)
        while server_alive(pid, container_id, children) and time.monotonic() < deadline + 2:
            await asyncio.sleep(0.05)


def terminate(pid: int, sig: signal.Signals) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def signalable(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def tail(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-LOG_TAIL_CHARS:]
    except OSError:
        return "(no log)"
