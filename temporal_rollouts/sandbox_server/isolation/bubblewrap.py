"""Run one shell command for a slot, inside bubblewrap when the host has it.

The slot's workspace is the only writable place the command sees (at /workspace), besides a
private, size-limited /tmp (and, read-only, the container cache entries the command named); the
system directories are read-only and nothing else of the host is visible. Every mount is
nosuid,nodev, and the command runs as an unprivileged uid with no capabilities (see
`temporal_rollouts.sandbox_server.limits.confinement.Confinement`). Every command gets its own process group
and session, and its own cgroup under the slot's where the host has one, so when it exits or
times out everything it started dies with it: no background process outlives the command that
started it, and nothing else of the slot (its stateful terminal, another command) dies with it.
A command runs in a sandbox of its own (its own pid namespace and /tmp), or, when it is
`resident`, is forked from the slot's resident launcher (`launcher`), whose sandbox the lease's
resident commands share. Without bubblewrap a command is refused unless isolation was explicitly
turned off.
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
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from temporal_rollouts.sandbox_server.files.beneath import WORKSPACE_MOUNT
from temporal_rollouts.sandbox_server.errors import SandboxLaunchFailed, SandboxRequired
from temporal_rollouts.sandbox_server.config import DEFAULT_UID_BASE, SlotLimits
from temporal_rollouts.sandbox_server.limits.confinement import Confinement, running_as_root
from temporal_rollouts.sandbox_server.files.output import BoundedOutput
from temporal_rollouts.sandbox_server.isolation import syscall_filter
from temporal_rollouts.sandbox_server.isolation.reaper import reap_orphans

if TYPE_CHECKING:
    from temporal_rollouts.sandbox_server.isolation.launcher import Launcher

log = logging.getLogger(__name__)

CACHE_MOUNT = "/cache"
"""Where a command sees the container's cache entries it named (`temporal_rollouts.sandbox_server.files.cache`)."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
READ_ONLY_DIRS = ("/usr", "/etc")
SYSTEM_LINK_DIRS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64")
# Secrets in /etc are masked as well as unreadable to the slot's uid (defence in depth).
MASKED_FILES = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/sudoers")
MASKED_DIRS = ("/etc/ssh", "/etc/sudoers.d", "/etc/ssl/private")
READ_CHUNK_BYTES = 64 * 1024
PROBE_UID = 65534
OUTPUT_DRAIN_S = 2.0
LAUNCH_ERROR_CHARS = 500

IsolationMode = Literal["bubblewrap", "none"]


class LauncherBroken(Exception):
    """A slot's resident launcher cannot run this command (`launcher`); it gets a sandbox of its own."""


@dataclass(frozen=True)
class CommandResult:
    exit_code: int | None
    output: str
    timed_out: bool
    truncated: bool
    duration_s: float
    bits_refused: bool = False
    """Whether it ran under `syscall_filter` (forked from the resident launcher), so it set no setuid bit."""


@dataclass(frozen=True)
class SlotSandbox:
    """Where and as whom one slot's commands run: its workspace, its uid and limits (`confinement`), its
    network, and whether running unisolated is refused. Every way a command starts (one-shot, the
    resident launcher, the terminal) takes it whole."""

    workspace: Path
    slot: int = 0
    confinement: Confinement | None = None
    """None: the default one (an unprivileged uid, no limits), for callers that name none."""
    allow_network: bool = False
    require_isolation: bool = True

    @property
    def confined(self) -> Confinement:
        return self.confinement if self.confinement is not None else default_confinement()


def sandbox_environment(home: str) -> dict[str, str]:
    return {"PATH": SANDBOX_PATH, "HOME": home, "LANG": "C.UTF-8", "TERM": "dumb"}


def bubblewrap_argv(
    bwrap: str,
    workspace: Path,
    command: list[str],
    *,
    allow_network: bool,
    as_root: bool | None = None,
    tmp_bytes: int = 0,
    cache: Sequence[Path] = (),
    as_pid_1: bool = False,
    seccomp_fd: int | None = None,
    read_only: bool = False,
    binds: Sequence[tuple[Path, str]] = (),
    writable: Sequence[tuple[Path, str]] = (),
) -> list[str]:
    """bwrap's argv around `command`. Run by root (`as_root`), bwrap needs no user namespace and the
    command must drop to the slot's uid itself (see `Confinement.drop_privileges`); run by anyone else,
    bwrap maps the caller's own unprivileged uid into a user namespace. Every bind mount is nosuid,nodev.
    `seccomp_fd`: a descriptor of `syscall_filter`'s program, which bwrap loads before the command runs.
    `as_pid_1`: the command is the pid namespace's init, with no bwrap init between it and the outer
    bwrap; the kernel shields it from signals sent inside the sandbox that it does not handle.
    `read_only`: the workspace is mounted read-only (a mount flag no process inside can lift).
    `binds`: more host folders, each bound read-only where the pair names (a harness's `/run/rollouts`);
    `writable`: host folders bound writable (a verifier's output folder)."""
    as_root = running_as_root() if as_root is None else as_root
    argv = [bwrap, *_namespaces(allow_network, as_pid_1), *([] if as_root else ["--unshare-user", "--cap-drop", "ALL"])]
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
    argv += _scratch(tmp_bytes, cache, binds, writable)
    argv += ["--ro-bind" if read_only else "--bind", str(workspace), WORKSPACE_MOUNT, "--chdir", WORKSPACE_MOUNT]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, *command]


def image_bubblewrap_argv(
    bwrap: str,
    root: Path,
    workdir: str,
    command: list[str],
    *,
    allow_network: bool,
    tmp_bytes: int = 0,
    cache: Sequence[Path] = (),
    as_pid_1: bool = False,
    seccomp_fd: int | None = None,
    read_only: bool = False,
    binds: Sequence[tuple[Path, str]] = (),
    writable: Sequence[tuple[Path, str]] = (),
) -> list[str]:
    """bwrap's argv around `command` in a slot on an item image (`image_root`): the slot's root (the image
    with the slot's own layer over it, mounted nosuid,nodev by the server) is `/`, with a fresh /proc, /dev
    and /tmp, and the command starts in the image's WORKDIR as root of a user namespace of its own whose
    only id is the caller's (the slot's uid), with no capability. `read_only`: the whole root is mounted
    read-only (a check that must change nothing). `binds` and `writable` as for `bubblewrap_argv`."""
    argv = [bwrap, *_namespaces(allow_network, as_pid_1), "--unshare-user", "--uid", "0", "--gid", "0"]
    argv += ["--cap-drop", "ALL", "--ro-bind" if read_only else "--bind", str(root), "/"]
    argv += _scratch(tmp_bytes, cache, binds, writable)
    argv += ["--chdir", workdir]
    if seccomp_fd is not None:
        argv += ["--seccomp", str(seccomp_fd)]
    return [*argv, *command]


def _namespaces(allow_network: bool, as_pid_1: bool) -> list[str]:
    """Every namespace a slot's sandbox has of its own (the user namespace is the caller's choice)."""
    argv = ["--unshare-pid", *(["--as-pid-1"] if as_pid_1 else []), "--unshare-ipc", "--unshare-uts"]
    argv.append("--unshare-cgroup-try")
    if not allow_network:
        argv.append("--unshare-net")
    return [*argv, "--hostname", "sandbox", "--die-with-parent", "--new-session"]


def _scratch(
    tmp_bytes: int,
    cache: Sequence[Path],
    binds: Sequence[tuple[Path, str]] = (),
    writable: Sequence[tuple[Path, str]] = (),
) -> list[str]:
    """A fresh /proc and /dev, a private sized /tmp, the cache entries read-only under /cache, the
    `binds` read-only and the `writable` ones writable where they say."""
    argv = ["--proc", "/proc", "--dev", "/dev", "--perms", "1777"]
    if tmp_bytes and bubblewrap_sizes_tmpfs():
        argv += ["--size", str(tmp_bytes)]
    argv += ["--tmpfs", "/tmp"]
    if cache:  # a folder every uid may search (bwrap's own would be root's alone), then each entry read-only
        argv += ["--perms", "0755", "--dir", CACHE_MOUNT]
    for entry in cache:
        argv += ["--ro-bind", str(entry), f"{CACHE_MOUNT}/{entry.name}"]
    for flag, pairs in (("--ro-bind", binds), ("--bind", writable)):
        for host, inside in pairs:  # its parent one every uid may search, as for the cache
            if (parent := os.path.dirname(inside)) != "/":
                argv += ["--perms", "0755", "--dir", parent]
            argv += [flag, str(host), inside]
    return argv


@functools.cache
def bubblewrap_path() -> str | None:
    """The bwrap binary if it is installed and can build a sandbox on this host."""
    bwrap = shutil.which("bwrap")
    return bwrap if bwrap is not None and bubblewrap_strategy() is not None else None


BubblewrapStrategy = Literal["as-root", "userns"]


@functools.cache
def bubblewrap_strategy() -> BubblewrapStrategy | None:
    """How bwrap runs here. A non-root server runs it in a user namespace of its own uid ("userns").
    A root server runs it as root without a user namespace, the command then dropping to the slot's
    uid ("as-root"); where root may not mount (a container without CAP_SYS_ADMIN), it drops to the
    slot's uid first and runs bwrap in a user namespace of that uid ("userns"), which needs every
    folder above a workspace to be searchable by others."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None
    if not running_as_root():
        return "userns" if _probe(bwrap, as_root=False) else None
    if _probe(bwrap, as_root=True):
        return "as-root"
    drop = _probe_drop()
    if drop and _probe(bwrap, as_root=False, drop=drop):
        log.warning("root cannot run bubblewrap here without a user namespace; slots drop their uid before it")
        return "userns"
    return None


def _probe_drop() -> list[str]:
    """The argv prefix that drops a root-run probe to an unprivileged uid ([] without setpriv)."""
    setpriv = shutil.which("setpriv")
    return [setpriv, "--reuid", str(PROBE_UID), "--regid", str(PROBE_UID), "--clear-groups", "--"] if setpriv else []


def _probe(bwrap: str, *, as_root: bool, drop: list[str] | None = None, seccomp_fd: int | None = None) -> bool:
    with tempfile.TemporaryDirectory() as probe_dir:
        if drop:
            os.chmod(probe_dir, 0o755)
            os.chown(probe_dir, PROBE_UID, PROBE_UID)
        sandbox = bubblewrap_argv(
            bwrap, Path(probe_dir), ["true"], allow_network=False, as_root=as_root, seccomp_fd=seccomp_fd
        )
        argv = [*(drop or []), *sandbox]
        try:
            probe = subprocess.run(
                argv,
                capture_output=True,
                timeout=15,
                env=sandbox_environment(WORKSPACE_MOUNT),
                check=False,
                pass_fds=() if seccomp_fd is None else (seccomp_fd,),
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            log.warning("bubblewrap is installed but cannot be started: %s", err)
            return False
    if probe.returncode != 0:
        log.warning(
            "bubblewrap cannot build a sandbox here (%s%s): %s",
            "as root" if as_root else "in a user namespace",
            "" if seccomp_fd is None else ", with the seccomp filter",
            probe.stderr.decode(errors="replace").strip(),
        )
        return False
    return True


@functools.cache
def setuid_bits_refused() -> bool:
    """Whether the agent's sandboxes (its launcher and terminal) run where no setuid or setgid bit can be
    set: libseccomp built `syscall_filter` and this bwrap loads it (a platform may refuse seccomp
    filters; tried once). Where not, they run without it and the server strips the bits after every
    command instead."""
    bwrap = bubblewrap_path()
    if bwrap is None or syscall_filter.compiled() is None:
        return False
    strategy = bubblewrap_strategy()
    drop = _probe_drop() if running_as_root() and strategy == "userns" else None
    fd = syscall_filter.descriptor()
    try:
        return _probe(bwrap, as_root=strategy == "as-root", drop=drop, seccomp_fd=fd)
    finally:
        if fd is not None:
            os.close(fd)


@functools.cache
def bubblewrap_sizes_tmpfs() -> bool:
    """Whether this bwrap knows `--size` (0.7+), which caps the command's /tmp."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return False
    try:
        helped = subprocess.run([bwrap, "--help"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return b"--size" in helped.stdout + helped.stderr


@functools.cache
def warn_unisolated_once() -> None:
    warn_unisolated()


def warn_unisolated() -> None:
    log.warning(
        "!!! bubblewrap is not available and require_isolation is off: sandbox commands run UNISOLATED "
        "on the host, with full network access and the host's files in view. Install bubblewrap, or "
        "turn require_isolation back on to refuse commands instead. !!!"
    )


@functools.cache
def warn_root_once() -> None:
    log.warning("!!! the sandbox server runs as root and cannot drop slots to another uid: commands run AS ROOT !!!")


def isolation_mode(require_isolation: bool) -> IsolationMode:
    if bubblewrap_path() is not None:
        return "bubblewrap"
    if require_isolation:
        raise SandboxRequired("isolation is required but bubblewrap is not available on the sandbox host")
    warn_unisolated_once()
    return "none"


def command_launch(
    script: list[str],
    sandbox: SlotSandbox,
    *,
    cache: Sequence[Path] = (),
    part: str = "command",
    as_pid_1: bool = False,
    seccomp_fd: int | None = None,
    read_only: bool = False,
    binds: Sequence[tuple[Path, str]] = (),
    writable: Sequence[tuple[Path, str]] = (),
    root: Path | None = None,
    environment: dict[str, str] | None = None,
) -> tuple[list[str], dict[str, str]]:
    """The argv and environment that start `script` (an argv) in the slot's sandbox, as the slot's uid
    within its limits: the one launch path shared by one-shot commands (`run_command`) and the stateful
    terminal's shell (`sessions`), so both get the same isolation and limits. Start it with
    `start_new_session=True` and `cwd=sandbox.workspace`. `cache`: host folders of cache entries the command
    sees read-only at /cache/<name> ($SANDBOX_CACHE); unisolated, it sees the host's folder itself.
    `part`: the command's own cgroup under the slot's (`Confinement.end_part` ends it alone).
    `as_pid_1`: `script` is its sandbox's pid 1 (`bubblewrap_argv`), and must reap what its children
    orphan (the resident launcher does). A process that drops its uid inside bwrap loses the parent-death
    signal bwrap gave it, so it must also end by itself when the server goes (the launcher: when its
    socket closes). `read_only`: the workspace is mounted read-only; refused unisolated, where nothing can
    make it so. `binds`: host folders bound read-only inside, `writable`: bound writable (bubblewrap only);
    `root`: on an item image, another root than the slot's (a verifier's pristine one); `environment`: more
    variables."""
    mode = isolation_mode(sandbox.require_isolation)
    if read_only and mode != "bubblewrap":
        raise SandboxRequired("a command with a read-only workspace needs bubblewrap, and this server runs unisolated")
    if (binds or writable) and mode != "bubblewrap":
        raise SandboxRequired("a command with folders of its own needs bubblewrap, and this server runs unisolated")
    confinement, slot, workspace = sandbox.confined, sandbox.slot, sandbox.workspace
    if running_as_root() and not confinement.dedicated_uids:
        if sandbox.require_isolation:
            raise SandboxRequired("the sandbox server runs as root but cannot drop slots to an unprivileged uid")
        warn_root_once()
    prefix = confinement.join_cgroups(slot, part) + confinement.rlimits()
    if mode == "bubblewrap" and confinement.image is not None:
        bwrap = bubblewrap_path()
        assert bwrap is not None
        argv = image_bubblewrap_argv(
            bwrap,
            root or workspace,
            confinement.image.workdir,
            script,
            allow_network=sandbox.allow_network,
            tmp_bytes=confinement.limits.tmp_bytes,
            cache=cache,
            as_pid_1=as_pid_1,
            seccomp_fd=seccomp_fd,
            read_only=read_only,
            binds=binds,
            writable=writable,
        )  # the uid is dropped first: bwrap makes the user namespace in which the slot's uid is root
        image_environment = _with_cache(confinement.image.environment(), CACHE_MOUNT if cache else None)
        return prefix + confinement.drop_privileges(slot) + argv, image_environment | (environment or {})
    if confinement.image is not None:
        raise SandboxRequired("slots on an item image need bubblewrap, and this server runs unisolated")
    if mode == "bubblewrap":
        bwrap = bubblewrap_path()
        assert bwrap is not None
        as_root = confinement.dedicated_uids and bubblewrap_strategy() == "as-root"
        # As root, bwrap mounts and the command drops its uid inside; otherwise the uid is dropped first.
        drop = confinement.drop_privileges(slot)
        outer, inner = ([], drop) if as_root else (drop, [])
        argv = (
            prefix
            + outer
            + bubblewrap_argv(  # --die-with-parent: bwrap dies with the server
                bwrap,
                workspace,
                inner + script,
                allow_network=sandbox.allow_network,
                as_root=as_root,
                tmp_bytes=confinement.limits.tmp_bytes,
                cache=cache,
                as_pid_1=as_pid_1,
                seccomp_fd=seccomp_fd,
                read_only=read_only,
                binds=binds,
                writable=writable,
            )
        )
        return argv, _with_cache(sandbox_environment(WORKSPACE_MOUNT), CACHE_MOUNT if cache else None) | (
            environment or {}
        )
    unisolated = _with_cache(sandbox_environment(str(workspace)), str(cache[0].parent) if cache else None)
    return prefix + confinement.drop_privileges(slot) + confinement.die_with_server() + script, unisolated | (
        environment or {}
    )


async def start_sandboxed(
    script: list[str],
    sandbox: SlotSandbox,
    *,
    stdin: int,
    stdout: int,
    stderr: int,
    pass_fds: Sequence[int] = (),
    filtered: bool = False,
    **launch: object,
) -> asyncio.subprocess.Process:
    """Start `script` as `command_launch` builds it (`launch`: its keyword options), in the workspace and
    in a session of its own, as every caller must: one-shot commands, the launcher, the terminal.
    `filtered`: the sandbox runs under `syscall_filter` (no setuid or setgid bit can be set in it) where
    bubblewrap loads it; the agent's own sandboxes (its launcher, its terminal) ask for it."""
    filter_fd = syscall_filter.descriptor() if filtered and setuid_bits_refused() else None
    try:
        argv, env = command_launch(script, sandbox, seccomp_fd=filter_fd, **launch)  # type: ignore[arg-type]
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=stdin,
            stdout=stdout,
            stderr=stderr,
            cwd=sandbox.workspace,
            env=env,
            start_new_session=True,
            pass_fds=(*pass_fds, *([] if filter_fd is None else [filter_fd])),
        )
    finally:
        if filter_fd is not None:
            os.close(filter_fd)


def _with_cache(environment: dict[str, str], folder: str | None) -> dict[str, str]:
    if folder is not None:
        environment["SANDBOX_CACHE"] = folder
    return environment


async def run_command(
    command: str,
    sandbox: SlotSandbox,
    *,
    timeout_s: float,
    max_output_chars: int,
    cache: Sequence[Path] = (),
    launcher: Launcher | None = None,
    read_only: bool = False,
    binds: Sequence[tuple[Path, str]] = (),
    writable: Sequence[tuple[Path, str]] = (),
    root: Path | None = None,
) -> CommandResult:
    """Run `command` with bash in the slot's workspace; its whole process tree dies when it ends.

    The command travels in a memory file that bash reads and evaluates, never on an argv, so a
    command of any length runs. It runs as the slot's uid within its limits (`sandbox.confinement`;
    the default one, with no limits, for callers that name none), in a sandbox of its own, or forked
    from the slot's resident `launcher` when one is given (and in a sandbox of its own if that fails).
    `read_only`: in a sandbox of its own whose workspace is mounted read-only (never the launcher's);
    `binds`, `writable` and `root` (a sandbox of its own too) as `command_launch` has them."""
    confinement, slot = sandbox.confined, sandbox.slot
    part = f"command-{uuid.uuid4().hex[:12]}"
    stops = confinement.stops(slot)
    output = BoundedOutput(max_output_chars)
    script_fd = _script_file(command)
    started_read, started_write = os.pipe()
    read_fd, write_fd = os.pipe()
    started = time.monotonic()
    try:
        running: Running | None = None
        if launcher is not None and not (read_only or binds or writable or root):
            try:  # fds as the launcher places them (`resident`); bash waits until the server lets it run
                argv = bash_script(3, 4, report=(5, 6))
                running = await launcher.spawn(argv, [write_fd, script_fd, started_write], confinement)
            except LauncherBroken as err:  # it never ran: the go byte was not sent
                log.info("slot %d: the command gets a sandbox of its own: %s", slot, err)
        if running is None:
            process = await start_sandboxed(
                bash_script(script_fd, started_write),
                sandbox,
                stdin=subprocess.DEVNULL,
                stdout=write_fd,
                stderr=write_fd,
                pass_fds=(script_fd, started_write),
                cache=cache,
                part=part,
                read_only=read_only,
                binds=binds,
                writable=writable,
                root=root,
            )
            running = OwnSandbox(process, confinement, slot, part)
    except BaseException:
        os.close(read_fd)
        os.close(started_read)
        raise
    finally:
        os.close(write_fd)
        os.close(script_fd)
        os.close(started_write)
    drain = PipeDrain(read_fd, output)
    timed_out = False
    try:
        with confinement.watched(slot, running.pid):
            try:
                async with asyncio.timeout(timeout_s):  # no task of its own, as wait_for would make
                    await running.wait()
            except TimeoutError:
                timed_out = True
            await running.kill()
            returncode = await running.wait()
        await running.finish()
        await asyncio.wait({drain.ended}, timeout=OUTPUT_DRAIN_S)
    finally:
        await running.kill()
        drain.close()
        reap_orphans()
    text, truncated = output.text()
    started_ok = _read_started(started_read)
    if not started_ok and not timed_out and returncode != 0 and confinement.stops(slot) == stops:
        raise SandboxLaunchFailed(
            f"the sandbox could not start the command (status {returncode}): "
            f"{text.strip()[-LAUNCH_ERROR_CHARS:] or 'no output'}"
        )
    text += confinement.notices(slot)
    return CommandResult(
        exit_code=returncode,
        output=text,
        timed_out=timed_out,
        truncated=truncated,
        duration_s=time.monotonic() - started,
        bits_refused=not isinstance(running, OwnSandbox) and setuid_bits_refused(),
    )


def bash_script(script_fd: int, started_fd: int, report: tuple[int, int] | None = None) -> list[str]:
    """bash's argv after the sandbox's: it says it started (one byte on the `started` pipe), then reads
    the command from the memory file and runs it as `bash -c` would (same $0, same messages); both are
    closed first, so nothing the command starts holds them. No byte: the sandbox never got as far as
    the command (`run_command` raises SandboxLaunchFailed). `report`: the fds of a resident launcher's
    socket and of the command's go pipe (`launcher`): bash first writes one byte to the socket, so the
    server learns its pid, and waits for the go byte (the server has moved it into its cgroup part)."""
    waits = ""
    if report is not None:
        socket_fd, go_fd = report
        waits = f"printf p >&{socket_fd} && read -r -n 1 <&{go_fd} || exit 125; unset REPLY; exec {socket_fd}>&- {go_fd}<&-; "
    return [
        "bash",
        "-c",
        f'{waits}printf . >&{started_fd}; exec {started_fd}>&-; eval "$(</dev/fd/{script_fd})" {script_fd}<&-',
        "bash",
    ]


class Running(Protocol):
    """A started command, whichever way it was started."""

    pid: int

    async def wait(self) -> int: ...

    async def kill(self) -> None:
        """Kill the command and everything in its process group."""

    async def finish(self) -> None:
        """Once it ended: kill whatever it left running in its part of the slot's cgroups."""


class OwnSandbox:
    """A command in a sandbox of its own: the server's child process, leader of its own process group."""

    def __init__(self, process: asyncio.subprocess.Process, confinement: Confinement, slot: int, part: str) -> None:
        self.process, self.pid = process, process.pid
        self._confinement, self._slot, self._part = confinement, slot, part

    async def wait(self) -> int:
        return await self.process.wait()

    async def kill(self) -> None:
        _kill_group(self.pid)

    async def finish(self) -> None:
        await asyncio.to_thread(self._confinement.end_part, self._slot, self._part)


def _read_started(fd: int) -> bool:
    """Whether bash wrote its one byte: the command itself ran (whatever became of it)."""
    try:
        os.set_blocking(fd, False)
        return os.read(fd, 1) == b"."
    except BlockingIOError:
        return False
    finally:
        os.close(fd)


@functools.cache
def default_confinement() -> Confinement:
    """For callers that name none: the default unprivileged uid, no limits."""
    return Confinement.detect(SlotLimits.off(), DEFAULT_UID_BASE, "default")


def _script_file(command: str) -> int:
    """A readable fd holding `command`: a memfd (no disk, no size limit but memory), else an unlinked temp file."""
    data = command.encode("utf-8", errors="surrogateescape")
    try:
        fd = os.memfd_create("sandbox-command", 0)
    except (AttributeError, OSError):
        handle, path = tempfile.mkstemp(prefix="sandbox-command-")
        os.unlink(path)
        os.fchmod(handle, 0o644)
        fd = handle
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


class PipeDrain:
    """Reads a command's output pipe into `output` from the event loop's readiness callback until every
    writer has closed it (`ended`). No transport, stream or task: a short command's output comes in one
    read and the end in the next, so a call costs two callbacks; `output` bounds what is kept."""

    def __init__(self, fd: int, output: BoundedOutput) -> None:
        self._fd, self._output = fd, output
        self._loop = asyncio.get_running_loop()
        self.ended: asyncio.Future[None] = self._loop.create_future()
        try:
            os.set_blocking(fd, False)
            self._loop.add_reader(fd, self._readable)
        except BaseException:
            os.close(fd)
            raise

    def _readable(self) -> None:
        try:
            chunk = os.read(self._fd, READ_CHUNK_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if chunk:
            self._output.feed(chunk)
        else:
            self.close()

    def close(self) -> None:
        """Stop reading (what is still unread is dropped) and close the pipe; idempotent."""
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
        if not self.ended.done():
            self.ended.set_result(None)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
