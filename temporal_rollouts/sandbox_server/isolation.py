"""Run one shell command for a slot, inside bubblewrap when the host has it.

The slot's workspace is the only writable place the command sees (at /workspace);
the system directories are read-only and nothing else of the host is visible.
Every command gets its own process group (and, under bubblewrap, its own pid
namespace), so when it exits or times out everything it started dies with it:
no background process outlives the command that started it.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from temporal_rollouts.sandbox_server.errors import SandboxRequired
from temporal_rollouts.sandbox_server.output import BoundedOutput

log = logging.getLogger(__name__)

WORKSPACE_MOUNT = "/workspace"
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
READ_ONLY_DIRS = ("/usr", "/etc")
SYSTEM_LINK_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64")
# Under a root-run server the sandbox user maps to host root, so secrets in /etc are masked.
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d", "/etc/ssl/private")
READ_CHUNK_BYTES = 64 * 1024
OUTPUT_DRAIN_S = 2.0

IsolationMode = Literal["bubblewrap", "none"]


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    duration_s: float


def sandbox_environment(home: str) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb"}


def bubblewrap_argv(bwrap: str, workspace: Path, command: str, *, allow_network: bool) -> list[str]:
    argv = [bwrap, "--unshare-user", "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    if not allow_network:
        argv.append("--unshare-net")
    argv += ["--hostname", "sandbox", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    for directory in READ_ONLY_DIRS:
        argv += ["--ro-bind-try", directory, directory]
    for path in MASKED_FILES:
        if os.path.exists(path):
            argv += ["--ro-bind", "/dev/null", path]
    for path in MASKED_DIRS:
        if os.path.isdir(path):
            argv += ["--tmpfs", path]
    for directory in SYSTEM_LINK_DIRS:
        if os.path.islink(directory):
            argv += ["--symlink", os.readlink(directory), directory]
        else:
            argv += ["--ro-bind-try", directory, directory]
    argv += ["--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp"]
    argv += ["--bind", str(workspace), WORKSPACE_MOUNT, "--chdir", WORKSPACE_MOUNT]
    return [*argv, "bash", "-c", command]


@functools.cache
def bubblewrap_path() -> str | None:
    """The bwrap binary if it is installed and can build a sandbox on this host."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    with tempfile.TemporaryDirectory() as probe_dir:
        argv = bubblewrap_argv(bwrap, Path(probe_dir), "true", allow_network=False)
        try:
            probe = subprocess.run(argv, capture_output=True, timeout=15, env=sandbox_environment(WORKSPACE_MOUNT))
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("bubblewrap is installed but cannot be started: %s", err)
            return None
    if probe.returncode != 0:
        log.warning(
            "bubblewrap is installed but cannot build a sandbox here: %s", probe.stderr.decode(errors="replace")
        )
        return None
    return bwrap


@functools.cache
def warn_unisolated_once() -> None:
    log.warning(
        "!!! bubblewrap is not available: sandbox commands run UNISOLATED on the host, with the "
        "server's user and full network access. Install bubblewrap or set require_isolation. !!!"
    )


def isolation_mode(require_isolation: bool) -> IsolationMode:
    if bubblewrap_path() is not None:
        return "bubblewrap"
    if require_isolation:
        raise SandboxRequired("isolation is required but bubblewrap is not available on the sandbox host")
    warn_unisolated_once()
    return "none"


def command_launch(
    command: str, workspace: Path, *, allow_network: bool, require_isolation: bool
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start `command` in the slot's sandbox: the one launch path shared by
    one-shot commands (`run_command`) and the stateful terminal's shell (`sessions`), so both get the
    same isolation and limits. Start it with `start_new_session=True` and `cwd=workspace`."""
    if isolation_mode(require_isolation) == "bubblewrap":
        bwrap = bubblewrap_path()
        assert bwrap is not None
        return bubblewrap_argv(bwrap, workspace, command, allow_network=allow_network), sandbox_environment(
            WORKSPACE_MOUNT
        )
    return ["bash", "-c", command], sandbox_environment(str(workspace))


async def run_command(
    command: str,
    workspace: Path,
    *,
    timeout_s: float,
    max_output_chars: int,
    allow_network: bool = False,
    require_isolation: bool = False,
) -> CommandResult:
    """Run `command` with bash in the slot's workspace; its whole process tree dies when it ends."""
    argv, env = command_launch(command, workspace, allow_network=allow_network, require_isolation=require_isolation)
    output = BoundedOutput(max_output_chars)
    started = time.monotonic()
    read_fd, write_fd = os.pipe()
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=write_fd,
            stderr=write_fd,
            cwd=workspace,
            env=env,
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    transport, reader = await _open_reader(read_fd)
    pump = asyncio.create_task(_pump(reader, output))
    timed_out = False
    try:
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except TimeoutError:
            timed_out = True
        _kill_group(proc.pid)
        await proc.wait()
        await asyncio.wait({pump}, timeout=OUTPUT_DRAIN_S)
    finally:
        _kill_group(proc.pid)
        pump.cancel()
        transport.close()
    text, truncated = output.text()
    return CommandResult(
        exit_code=proc.returncode,
        output=text,
        timed_out=timed_out,
        truncated=truncated,
        duration_s=time.monotonic() - started,
    )


async def _open_reader(read_fd: int) -> tuple[asyncio.BaseTransport, asyncio.StreamReader]:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=READ_CHUNK_BYTES)
    pipe = os.fdopen(read_fd, "rb", buffering=0)
    transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), pipe)
    return transport, reader


async def _pump(reader: asyncio.StreamReader, output: BoundedOutput) -> None:
    while chunk := await reader.read(READ_CHUNK_BYTES):
        output.feed(chunk)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
