"""A resident launcher per slot: an agent's one-shot commands without building a sandbox for each.

Building a slot's sandbox for one command (the cgroup join, prlimit, setpriv, bubblewrap and
its namespaces) costs the server about ten CPU-ms; starting bash about two. So the first
`resident` one-shot command of a lease starts a small launcher (`resident.py`) inside the slot's
sandbox, through `bubblewrap.command_launch` like every command (same uid, limits, mounts and
network policy), and each resident command after it is a bash the launcher starts.

What holds as for a sandbox of its own: the command runs as the slot's uid with no capabilities
and no new privileges, in a session of its own and, where the host has cgroups, in a part of the
slot's it has to itself (COMMAND_PART: the server moves it there before it may start, as bash
waits on a pipe only the server writes). When it ends or times out everything it started is
killed: by the launcher, which as its sandbox's pid 1 kills every other process in it once the
command's bash has ended (the server kills that bash at a timeout), and through the cgroup part.
Timeouts, output bounds and the launch-failure check are `bubblewrap.run_command`'s, shared. The
command's pid comes from the kernel (SCM_CREDENTIALS), never from what the sandbox says.

What differs: the resident commands of one lease share the launcher's /tmp and pid namespace,
as commands in one container do (the original's terminals ran in a persistent container).
Commands that are not `resident` (setup and verify hooks: a verifier must not see what an
agent's command left in /tmp), that name cache entries, or that run without bubblewrap get a
sandbox of their own as before, and so does any command the launcher fails to start or answer
for. Without cgroups the watchdog watches the launcher for the lease, as it does a session.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import fcntl
import functools
import logging
import os
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.sandbox_server.files.beneath import folder_beneath, lstat_at, open_root
from temporal_rollouts.sandbox_server.config import SlotLimits
from temporal_rollouts.sandbox_server.files.image_root import IMAGE_PYTHON
from temporal_rollouts.sandbox_server.isolation.bubblewrap import (
    READ_ONLY_DIRS,
    SYSTEM_LINK_DIRS,
    LauncherBroken,
    SlotSandbox,
    isolation_mode,
    start_sandboxed,
)
from temporal_rollouts.sandbox_server.limits.confinement import Confinement

log = logging.getLogger(__name__)

LAUNCHER_PART = "launcher"
"""The launcher's own cgroup part: its commands are moved out of it before they start."""
COMMAND_PART = "resident"
"""The part of the slot's cgroups a resident command runs in: one at a time, each found empty (what the
one before left was killed when it ended), and kept from one to the next (no folders made per command)."""
PROGRAM = Path(__file__).with_name("resident.py")
PROGRAM_NAME = "rollouts-slot-launcher"
"""What `ps` shows of a launcher (with its slot), instead of the program's whole source as `python -c` did."""
START_TIMEOUT_S = 10.0
PLACE_TIMEOUT_S = 5.0
"""How long a launcher may take to fork a command and report it; longer, and it is replaced."""
EXIT_GRACE_S = 2.0
STOP_GRACE_S = 1.0
"""How long a launcher whose socket closed may take to exit before it is killed."""
"""How long a launcher may take to report a command the server killed."""
MESSAGE_BYTES = 4096
UCRED = struct.Struct("iII")  # pid, uid, gid


@dataclass(frozen=True)
class LauncherKey:
    """What a launcher was started under: a command with another key needs another launcher."""

    lease_id: str
    allow_network: bool
    limits: SlotLimits


@functools.cache
def program_fd() -> int:
    """A sealed memory file holding the launcher's program, which each launcher's Python reads as
    `/dev/fd/N`: the sandbox sees none of the server's files, and the command line stays short. Sealed,
    so nothing that holds it (a launcher, before it closes it) can change what the next one runs."""
    source = PROGRAM.read_bytes()
    try:
        fd = os.memfd_create("rollouts-slot-launcher", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    except (AttributeError, OSError):
        fd, path = tempfile.mkstemp(prefix="rollouts-slot-launcher-")
        os.unlink(path)
        os.fchmod(fd, 0o444)
    view = memoryview(source)
    while view:
        view = view[os.write(fd, view) :]
    with contextlib.suppress(AttributeError, OSError):  # a temp file cannot be sealed: it is read-only to others
        fcntl.fcntl(
            fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SEAL
        )
    return fd


def launcher_argv(python: str, slot: int, channel_fd: int) -> list[str]:
    """`python3 -I -S /dev/fd/N rollouts-slot-launcher slot=K CHANNEL`: the program from its memory file, a
    name and the slot for whoever reads `ps`, and the socket's fd last (the only argument it reads)."""
    return [python, "-I", "-S", f"/dev/fd/{program_fd()}", PROGRAM_NAME, f"slot={slot}", str(channel_fd)]


@functools.cache
def sandbox_python() -> str | None:
    """A Python the slot's sandbox can run: one under the read-only system folders it sees."""
    for candidate in (sys.executable, shutil.which("python3"), "/usr/bin/python3"):
        if not candidate:
            continue
        real = os.path.realpath(candidate)
        seen = any(real.startswith(f"{folder}/") for folder in (*READ_ONLY_DIRS, *SYSTEM_LINK_DIRS))
        if seen and os.access(real, os.X_OK):
            return real
    return None


def image_python(root: Path) -> str | None:
    """The image's Python (`/usr/bin/python3`, a file or a link), looked up in the slot's root without
    following a link the agent may have put on the way; None where the image has none."""
    *folders, name = IMAGE_PYTHON.strip("/").split("/")
    try:
        top = open_root(root)
    except OSError:
        return None
    try:
        folder = folder_beneath(top, tuple(folders), create=False)
    except OSError:
        return None
    finally:
        os.close(top)
    try:
        return IMAGE_PYTHON if lstat_at(folder, name) is not None else None
    finally:
        os.close(folder)


class Launcher:
    """One slot's launcher process and the server's end of its socket."""

    def __init__(
        self, process: asyncio.subprocess.Process, channel: socket.socket, slot: int, key: LauncherKey, uid: int
    ) -> None:
        self.process, self.key, self.slot = process, key, slot
        self._channel = channel
        self._uid = uid
        self._messages: asyncio.Queue[tuple[bytes, int | None, int | None]] = asyncio.Queue()
        self._closed = False
        self._watching = contextlib.ExitStack()
        self.idle = True
        """False from a command's start until its exit is read: a launcher left otherwise is replaced."""
        self._own_pid: int | None = None
        self.part_seen_empty = False
        """COMMAND_PART was found empty after the last command ended: nothing can have entered it since
        (only the server moves processes there), so the next command need not look again."""
        asyncio.get_running_loop().add_reader(channel.fileno(), self._receive)

    @classmethod
    async def start(cls, sandbox: SlotSandbox, key: LauncherKey) -> Launcher:
        slot, confinement = sandbox.slot, sandbox.confined
        python = image_python(sandbox.workspace) if confinement.image is not None else sandbox_python()
        if python is None:
            raise LauncherBroken(
                "the image has no /usr/bin/python3"
                if confinement.image
                else "no Python under the folders the sandbox sees"
            )
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            ours.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
            ours.setblocking(False)
            process = await start_sandboxed(
                launcher_argv(python, slot, theirs.fileno()),
                sandbox,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                pass_fds=(theirs.fileno(), program_fd()),
                part=LAUNCHER_PART,
                as_pid_1=True,
                filtered=True,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        uid = confinement.uid(slot) if confinement.dedicated_uids else os.getuid()
        launcher = cls(process, ours, slot, key, uid)
        await launcher.until_ready(confinement)
        return launcher

    async def until_ready(self, confinement: Confinement) -> None:
        """Wait for the launcher's first word; from then on the watchdog (where there is one) watches it."""
        self._watching.enter_context(confinement.watched(self.slot, self.process.pid))
        try:
            ready, self._own_pid, _ = await self.message(START_TIMEOUT_S)
        except TimeoutError:
            ready = b""
        if ready != b"ready":
            why = await self._stderr()
            await self.stop(confinement)
            raise LauncherBroken(f"the launcher did not start: {why or 'no output'}")

    @property
    def alive(self) -> bool:
        return not self._closed and self.process.returncode is None

    @property
    def usable(self) -> bool:
        return self.alive and self.idle

    def _receive(self) -> None:
        try:
            data, ancillary, _, _ = self._channel.recvmsg(MESSAGE_BYTES, socket.CMSG_SPACE(UCRED.size))
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data, ancillary = b"", []
        pid = uid = None
        for level, kind, payload in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS and len(payload) >= UCRED.size:
                pid, uid, _ = UCRED.unpack(payload[: UCRED.size])
        if not data:
            self._closed = True
            asyncio.get_running_loop().remove_reader(self._channel.fileno())
        self._messages.put_nowait((data, pid, uid))

    async def message(self, timeout_s: float | None) -> tuple[bytes, int | None, int | None]:
        """The launcher's next message, with the sender's pid and uid as the kernel gave them (b"": it ended)."""
        if self._closed and self._messages.empty():
            return b"", None, None
        async with asyncio.timeout(timeout_s):
            return await self._messages.get()

    async def spawn(self, argv: list[str], fds: list[int], confinement: Confinement) -> LaunchedCommand:
        """Start `argv` (`bubblewrap.bash_script` with `report`) from the launcher with `fds` (output, script,
        started) once it sits in COMMAND_PART of the slot's cgroups. Raises LauncherBroken if it cannot."""
        if not self.usable:
            raise LauncherBroken("the launcher has ended")
        self.idle = False
        go_read, go_write = os.pipe()
        try:
            payload = b"run" + b"\0".join(arg.encode("utf-8", "surrogateescape") for arg in argv)
            rights = array.array("i", [*fds, go_read])
            self._channel.sendmsg([payload], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
        except OSError as err:
            os.close(go_write)
            await self.stop(confinement)
            raise LauncherBroken(f"cannot reach the launcher: {err}") from None
        finally:
            os.close(go_read)
        try:
            pid, pidfd = await self._placed(confinement)
        except BaseException:
            os.close(go_write)
            raise
        try:
            os.write(go_write, b"g")
        except OSError as err:  # bash is gone already
            os.close(pidfd)
            await self.stop(confinement)
            raise LauncherBroken(f"the command ended before it started: {err}") from None
        finally:
            os.close(go_write)
        return LaunchedCommand(self, pid, pidfd, confinement)

    async def _placed(self, confinement: Confinement) -> tuple[int, int]:
        """The command's pid and a pidfd of it, once it is in its cgroup part (where the host has
        cgroups); on any irregularity the launcher is stopped."""
        try:
            message, pid, uid = await self.message(PLACE_TIMEOUT_S)
        except TimeoutError:
            message, pid, uid = b"", None, None
        if message.startswith(b"fail"):  # it could not fork (say, the slot is at its process limit)
            self.idle = True
            raise LauncherBroken(message.decode(errors="replace"))
        if message != b"p" or pid is None or uid != self._uid or pid == self._own_pid:
            await self.stop(confinement)
            raise LauncherBroken(f"the launcher answered {message[:40]!r} from pid {pid}, uid {uid}")
        try:
            pidfd = os.pidfd_open(pid)
        except OSError as err:
            await self.stop(confinement)
            raise LauncherBroken(f"the launcher's child {pid} is gone: {err}") from None
        try:
            if not self.part_seen_empty and not confinement.part_is_empty(self.slot, COMMAND_PART):
                await asyncio.to_thread(confinement.kill_part, self.slot, COMMAND_PART)  # the last command's
            self.part_seen_empty = False
            confinement.move_into_part(self.slot, COMMAND_PART, pid)  # a few small writes: not worth a thread
            # The child cannot have been reaped and its pid reused while the pidfd still says it lives.
            if _readable(pidfd):
                raise OSError(f"pid {pid} exited before it was placed")
        except OSError as err:
            os.close(pidfd)
            await self.stop(confinement)
            raise LauncherBroken(f"cannot move the command into its cgroup: {err}") from None
        return pid, pidfd

    async def stop(self, confinement: Confinement) -> None:
        """End the launcher's sandbox and everything in it: the launcher exits when its socket closes
        (and its bwrap with it, reaping it); one that does not within a second is killed."""
        if not self._closed:
            self._closed = True
            asyncio.get_running_loop().remove_reader(self._channel.fileno())
        self._channel.close()
        if self.process.returncode is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self.process.wait()), STOP_GRACE_S)
        if self.process.returncode is None:  # never a group whose leader was reaped: its id may be reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, signal.SIGKILL)
        await asyncio.to_thread(confinement.end_part, self.slot, LAUNCHER_PART)
        with contextlib.suppress(ProcessLookupError):
            await self.process.wait()
        self._watching.close()

    async def _stderr(self) -> str:
        if self.process.stderr is None:
            return ""
        with contextlib.suppress(TimeoutError):
            data = await asyncio.wait_for(self.process.stderr.read(2000), 1.0)
            return data.decode(errors="replace").strip()
        return ""


def _readable(fd: int) -> bool:
    """Whether `fd` is readable now (a pidfd: its process ended); poll, since select stops at fd 1023."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


class LaunchedCommand:
    """A command the launcher started: `run_command` waits for it and kills it like its own sandbox."""

    def __init__(self, launcher: Launcher, pid: int, pidfd: int, confinement: Confinement) -> None:
        self.launcher, self.pid = launcher, pid
        self._pidfd: int | None = pidfd
        """Names the command's bash for as long as the server may signal it, whoever reaps it."""
        self._confinement = confinement
        self._code: int | None = None
        self._done = False

    async def wait(self) -> int:
        """The command's exit status as the launcher reported it (128 + n: signal n killed it), or -9
        where the server killed it (a timeout), as for a command in a sandbox of its own."""
        if not self._done:
            message, _, _ = await self.launcher.message(None)
            self._done = True
            try:
                self._code = int(message.removeprefix(b"exit ")) if message.startswith(b"exit ") else None
            except ValueError:
                self._code = None
            self._close_pidfd()
            if self._code is None:  # the launcher ended (its command killed it): so did its sandbox
                await self.launcher.stop(self._confinement)
                self._code = -signal.SIGKILL
            else:
                self.launcher.idle = True
        assert self._code is not None
        return self._code

    async def kill(self) -> None:
        """Kill the command and all it started (the launcher kills the rest once its bash is dead);
        the launcher then reports it, or is replaced."""
        if self._done:
            return
        if self._pidfd is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                signal.pidfd_send_signal(self._pidfd, signal.SIGKILL)
        await asyncio.to_thread(self._confinement.kill_part, self.launcher.slot, COMMAND_PART)
        try:
            await asyncio.wait_for(self.wait(), EXIT_GRACE_S)
        except TimeoutError:
            await self.launcher.stop(self._confinement)
        self._close_pidfd()
        self._done, self._code = True, -signal.SIGKILL

    def _close_pidfd(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    async def finish(self) -> None:
        """Kill what the command left running (its part is kept for the next command)."""
        if self._confinement.part_is_empty(self.launcher.slot, COMMAND_PART):
            self.launcher.part_seen_empty = True
        else:
            await asyncio.to_thread(self._confinement.kill_part, self.launcher.slot, COMMAND_PART)


class SlotLaunchers:
    """The launchers of one server's slots, by slot index; a launcher is only used under its slot's lock."""

    def __init__(self) -> None:
        self._launchers: dict[int, tuple[Launcher, Confinement]] = {}
        self._failed: dict[int, str] = {}
        """Slot -> the lease under which its launcher failed to start: not tried again for that lease."""

    async def for_command(self, sandbox: SlotSandbox, lease_id: str) -> Launcher | None:
        """The slot's launcher for this lease, started if need be; None where commands need sandboxes of their own."""
        if isolation_mode(sandbox.require_isolation) != "bubblewrap":  # its pid namespace holds all a command starts
            return None
        slot, confinement = sandbox.slot, sandbox.confined
        key = LauncherKey(lease_id, sandbox.allow_network, confinement.limits)
        current = self._launchers.get(slot)
        if current is not None and current[0].key == key and current[0].usable:
            return current[0]
        await self.stop(slot)
        if self._failed.get(slot) == lease_id:
            return None
        stops = confinement.stops(slot)
        try:
            launcher = await Launcher.start(sandbox, key)
        except LauncherBroken as err:
            if confinement.stops(slot) != stops:  # killed by a stop for a limit: the next command starts another
                return None
            self._failed[slot] = lease_id
            log.warning("slot %d runs this lease's commands in sandboxes of their own: %s", slot, err)
            return None
        self._launchers[slot] = (launcher, confinement)
        return launcher

    async def stop(self, slot: int) -> None:
        if (current := self._launchers.pop(slot, None)) is not None:
            launcher, confinement = current
            await launcher.stop(confinement)

    async def close(self) -> None:
        for slot in list(self._launchers):
            await self.stop(slot)
