"""Memory a slot's processes hold beyond their private pages, as the watchdog counts it.

A memory cgroup charges a slot for its page cache, its shared memory and its tmpfs files. Without
one, the watchdog added up resident sizes only, and a 256 MiB slot held 1.5 GiB of memfds (the
issue's attack): a memfd written with write() is in no process's RSS. So each process of a slot is
counted as its private pages (RssAnon + RssFile) plus the shared objects it holds, each object
once however many processes hold it, by the pages it has (st_blocks):

- memfds it holds open (/proc/PID/fd, `FDS_PER_PASS` descriptors of a slot looked at per pass);
- every shared mapping when its RssShmem says it has one (/proc/PID/maps, map_files): memfds,
  SysV segments, shared anonymous memory, tmpfs files;
- the tmpfs mounts of its sandbox (/tmp, /dev, /dev/shm, a user namespace's root), by statfs, one
  count per mount: files there outlive the process that wrote them.

Not counted (and `/health` says so): a SysV segment no process has attached (it lives in the
sandbox's IPC namespace until the sandbox ends) and kernel memory (page tables, socket buffers).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field

Key = tuple[int, int]
"""(st_dev, st_ino) of a shared object; (st_dev, -1) for a whole tmpfs mount."""
SHARED_MAPPINGS = ("/memfd:", "/SYSV", "/dev/zero", "/dev/shm/")
FDS_PER_PASS = 4096
"""Descriptors of one slot's processes looked at per watchdog pass (about 6 ms): the pass never grows with
what the slot opened, and a memfd among 100,000 open files is found within 5 s."""
KIB = 1024


@dataclass(frozen=True)
class Held:
    """What one process holds: its private pages, and the shared objects it holds with their sizes."""

    private: int
    shared: dict[Key, int] = field(default_factory=dict)


@dataclass
class FdScan:
    """Where the scan of one process's descriptors stands: the next descriptor to look at, and the memfds
    found so far (descriptor -> key), whose sizes are read again on every pass."""

    next_fd: int = 0
    memfds: dict[int, Key] = field(default_factory=dict)


@dataclass
class MountCache:
    """What the watchdog remembers between passes: the tmpfs mount points of each sandbox's mount namespace
    (read once), this server's own namespace, and how far each process's descriptors were scanned."""

    own: str = field(default_factory=lambda: _link("/proc/self/ns/mnt"))
    tmpfs: dict[str, list[str]] = field(default_factory=dict)
    fds: dict[int, FdScan] = field(default_factory=dict)
    budget: int = 0
    """Descriptors still to look at in this pass over one slot (`FDS_PER_PASS` at its start)."""

    def forget_others(self, pids: set[int]) -> None:
        for pid in [pid for pid in self.fds if pid not in pids]:
            del self.fds[pid]


def held_by(pid: int, mounts: MountCache) -> Held | None:
    """What process `pid` holds now; None when it is gone."""
    try:
        status = _status(pid)
    except OSError:
        return None
    shared: dict[Key, int] = {}
    scan = mounts.fds.setdefault(pid, FdScan())
    _scan_fds(pid, scan, mounts)
    for fd in list(scan.memfds):
        if not _add(shared, f"/proc/{pid}/fd/{fd}"):
            del scan.memfds[fd]
    if status.get("RssShmem", 0):
        with contextlib.suppress(OSError), open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as maps:
            for line in maps:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[3] != "00:00" and parts[5].startswith(SHARED_MAPPINGS):
                    _add(shared, f"/proc/{pid}/map_files/{parts[0]}")
    tmpfs = _sandbox_tmpfs(pid, mounts)
    for key in [key for key in shared if (key[0], -1) in tmpfs]:  # a file of a counted mount: counted with it
        del shared[key]
    shared.update(tmpfs)
    return Held(private=(status.get("RssAnon", 0) + status.get("RssFile", 0)) * KIB, shared=shared)


def _scan_fds(pid: int, scan: FdScan, mounts: MountCache) -> None:
    """Look at more descriptors of `pid` for memfds, from where the last pass stopped, while the pass's budget
    lasts: processes with a million open files cost the server a bounded share of each pass, and are read
    whole over several."""
    try:
        with os.scandir(f"/proc/{pid}/fd") as entries:
            for entry in entries:
                fd = int(entry.name)
                if fd < scan.next_fd:
                    continue
                if mounts.budget <= 0:
                    scan.next_fd = fd
                    return
                mounts.budget -= 1
                if _link(entry.path).startswith("/memfd:"):
                    with contextlib.suppress(OSError):
                        info = os.stat(entry.path)
                        scan.memfds[fd] = (info.st_dev, info.st_ino)
    except OSError:
        pass
    scan.next_fd = 0


def _status(pid: int) -> dict[str, int]:
    found = {}
    with open(f"/proc/{pid}/status", encoding="utf-8", errors="replace") as status:
        for line in status:
            if line.startswith("Rss"):
                name, _, value = line.partition(":")
                found[name] = int(value.split()[0])
    return found


def _sandbox_tmpfs(pid: int, mounts: MountCache) -> dict[Key, int]:
    """The used bytes of each tmpfs mount in the sandbox of `pid` (none outside a sandbox: the host's are
    not the slot's)."""
    namespace = _link(f"/proc/{pid}/ns/mnt")
    if not namespace or namespace == mounts.own:
        return {}
    if namespace not in mounts.tmpfs:
        mounts.tmpfs[namespace] = _tmpfs_mount_points(pid)
    found = {}
    for point in mounts.tmpfs[namespace]:
        with contextlib.suppress(OSError):
            path = f"/proc/{pid}/root{point}"
            device, stats = os.stat(path).st_dev, os.statvfs(path)
            found[(device, -1)] = (stats.f_blocks - stats.f_bfree) * stats.f_frsize
    return found


def _tmpfs_mount_points(pid: int) -> list[str]:
    points = []
    with contextlib.suppress(OSError), open(f"/proc/{pid}/mountinfo", encoding="utf-8", errors="replace") as info:
        for line in info:
            before, _, after = line.partition(" - ")
            if after.split(" ", 1)[0] == "tmpfs":
                points.append(_unescape(before.split()[4]))
    return points


def _add(shared: dict[Key, int], path: str) -> bool:
    try:
        info = os.stat(path)
    except OSError:
        return False
    shared[(info.st_dev, info.st_ino)] = info.st_blocks * 512
    return True


def _link(path: str) -> str:
    try:
        return os.readlink(path)
    except OSError:
        return ""


def _unescape(path: str) -> str:
    """A mount point as /proc/PID/mountinfo writes it (octal escapes for space, tab, newline, backslash)."""
    if "\\" not in path:
        return path
    return path.encode().decode("unicode_escape").encode("latin-1").decode(errors="replace")
