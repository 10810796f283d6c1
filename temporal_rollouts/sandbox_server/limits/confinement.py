"""Per-slot confinement: which uid a slot's commands run as, and the limits they run within.

A slot runs as an unprivileged uid. When the server runs as root, slot `i` runs as
the dedicated uid/gid `uid_base + i` (so RLIMIT_NPROC, which the kernel counts per
uid, is a per-slot limit); otherwise it runs as the server's own (unprivileged) uid.

Limits use the best mechanism the host has, and `/health` says which one is in force:

| limit            | mechanism, best first                                             |
| ---------------- | ----------------------------------------------------------------- |
| memory           | cgroup (v2 memory.max, v1 memory.limit_in_bytes); else the watchdog |
|                  | (the slot's processes added up) and RLIMIT_AS on each process      |
| processes        | cgroup pids.max; else RLIMIT_NPROC (per slot with a dedicated uid; |
|                  | with a shared uid: what the uid runs now plus the limit)           |
| cpus             | cgroup cpu quota; else the watchdog pauses the slot past its share |
| cpu time         | RLIMIT_CPU on every process of the command                         |
| file size        | RLIMIT_FSIZE on every process of the command                       |
| /tmp             | a tmpfs of that size, private to each command                      |
| workspace disk,  | the slot's own filesystem (its size and inodes), else checked by   |
| files            | walking it; past either, the slot's processes are stopped          |
|                  | (`slot_volume`, `disk_guard`)                                      |
| wall time        | the command timeout; the whole tree is killed (process group, pid  |
|                  | namespace, and every process left in the command's part of the     |
|                  | slot's cgroup: the slot's session and other commands run on)       |

A slot past a limit it cannot be held below (its disk, its files) has every process stopped
(`stop_slot`): its commands, its terminal and whatever they left running in the background.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from temporal_rollouts.sandbox_server.config import DEFAULT_UID_BASE, DEFAULT_UID_COUNT, SlotLimits
from temporal_rollouts.sandbox_server.files.image_root import ImageRoot
from temporal_rollouts.sandbox_server.limits.watchdog import Watchdog

log = logging.getLogger(__name__)

CGROUP_ROOT = Path("/sys/fs/cgroup")
KILL_ROUNDS = 50
MAX_REMEMBERED_PARTS = 4096
PROCS_PEEK_BYTES = 64
"""Enough of a cgroup.procs file to tell whether it lists any pid."""


@dataclass
class _Cgroups:
    """The cgroup directories (one per controller in v1, one in v2) under which slot cgroups are made."""

    version: str  # "v1" or "v2"
    parents: dict[str, Path]  # controller -> directory; v2 uses the same directory for every controller

    def slot_dirs(self, name: str) -> dict[str, Path]:
        return {controller: parent / name for controller, parent in self.parents.items()}


def running_as_root() -> bool:
    return os.geteuid() == 0


def _own_cgroup_paths() -> dict[str, str]:
    paths: dict[str, str] = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        _, controllers, path = line.split(":", 2)
        for controller in controllers.split(",") if controllers else [""]:
            paths[controller] = path
    return paths


def _writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK)


def _detect_cgroups(wanted: set[str]) -> _Cgroups | None:
    """A place to make slot cgroups in, or None when this host gives us none (no delegation)."""
    if not wanted:
        return None
    own = _own_cgroup_paths()
    controllers_file = CGROUP_ROOT / "cgroup.controllers"
    if controllers_file.exists():  # cgroup v2 (unified)
        return _detect_v2(own.get("", "/"), wanted)
    parents: dict[str, Path] = {}
    for controller in wanted:
        base = CGROUP_ROOT / controller
        own_path = own.get(controller, "/").lstrip("/")
        candidate = base / own_path if own_path else base
        if _writable_dir(candidate) and (candidate / "cgroup.procs").exists():
            parents[controller] = candidate
    return _Cgroups("v1", parents) if parents else None


def _detect_v2(own_path: str, wanted: set[str]) -> _Cgroups | None:
    """Under cgroup v2 a cgroup with processes cannot enable controllers for children, so the
    server moves itself into a leaf `server` child first (only when it is alone in its cgroup)."""
    mine = CGROUP_ROOT / own_path.lstrip("/")
    try:
        available = set((mine / "cgroup.controllers").read_text().split())
        enable = sorted(wanted & available)
        if not enable:
            return None
        subtree = mine / "cgroup.subtree_control"
        try:
            subtree.write_text(" ".join(f"+{c}" for c in enable))
        except OSError:
            procs = (mine / "cgroup.procs").read_text().split()
            if procs != [str(os.getpid())]:
                return None
            leaf = mine / "server"
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
            subtree.write_text(" ".join(f"+{c}" for c in enable))
    except OSError as err:
        log.info("cgroup v2 controllers cannot be delegated here (%s); falling back to rlimits", err)
        return None
    return _Cgroups("v2", {controller: mine for controller in enable})


@dataclass
class Confinement:
    """How every command of one server is confined; `for_slot` gives the parts of one slot."""

    limits: SlotLimits
    uid_base: int = DEFAULT_UID_BASE
    uid_count: int = DEFAULT_UID_COUNT
    container_id: str = "local"
    dedicated_uids: bool = field(default_factory=running_as_root)
    cgroups: _Cgroups | None = None
    prlimit: str | None = None
    setpriv: str | None = None
    pdeathsig: str | None = None
    """setpriv, to make the command's outermost process die with the server (no cgroup needed)."""
    watchdog: Watchdog | None = None
    """Holds the slot-wide memory and CPU limits that no cgroup holds (`unwatched_limits`)."""
    slot_uids: dict[int, int] = field(default_factory=dict)
    """The uid each slot claimed on this host (`uids.UidClaims`); unclaimed slots fall back to base + index."""
    image: ImageRoot | None = None
    """The item image every slot runs on (`image_root`); None: the server's own root."""
    _stops: dict[int, int] = field(default_factory=dict, repr=False, compare=False)
    _sandboxes: dict[int, set[int]] = field(default_factory=dict, repr=False, compare=False)
    """slot -> the pids of the sandboxes it runs now (`watched`); shared by every copy (`with_limits`)."""
    _part_folders: dict[tuple[int, str], tuple[Path, ...]] = field(default_factory=dict, repr=False, compare=False)
    """(slot, part) -> the part's distinct folders, sorted: a resident command asks three times per call,
    and building the paths cost more than the cgroup writes themselves."""

    @classmethod
    def detect(
        cls,
        limits: SlotLimits,
        uid_base: int,
        container_id: str,
        use_cgroups: bool = True,
        uid_count: int = DEFAULT_UID_COUNT,
    ) -> Confinement:
        wanted = set()
        if limits.memory_bytes:
            wanted.add("memory")
        if limits.max_processes:
            wanted.add("pids")
        if limits.cpus:
            wanted.add("cpu")
        root = running_as_root()
        setpriv = shutil.which("setpriv") if root else None
        if root and setpriv is None:
            log.error("setpriv is missing: a root-run server cannot drop slots to an unprivileged uid")
        return cls(
            limits=limits,
            uid_base=uid_base,
            uid_count=uid_count,
            container_id=container_id,
            dedicated_uids=root and setpriv is not None,
            cgroups=_detect_cgroups(wanted) if use_cgroups else None,
            prlimit=shutil.which("prlimit"),
            setpriv=setpriv,
            pdeathsig=shutil.which("setpriv"),
        )

    def with_limits(self, limits: SlotLimits | None) -> Confinement:
        """The same confinement (uids, cgroups, tools) with other limits, for one lease."""
        return self if limits is None else dataclasses.replace(self, limits=limits)

    # --- who a slot runs as -------------------------------------------------------------

    def uid(self, slot: int) -> int:
        return self.slot_uids.get(slot, self.uid_base + slot) if self.dedicated_uids else os.getuid()

    def gid(self, slot: int) -> int:
        return self.uid(slot) if self.dedicated_uids else os.getgid()

    def drop_privileges(self, slot: int) -> list[str]:
        """The argv prefix that turns a root process into the slot's uid, with no capabilities left."""
        if not self.dedicated_uids:
            return []
        assert self.setpriv is not None
        uid, gid = str(self.uid(slot)), str(self.gid(slot))
        return [
            self.setpriv,
            "--reuid",
            uid,
            "--regid",
            gid,
            "--clear-groups",
            "--inh-caps",
            "-all",
            "--bounding-set",
            "-all",
            "--no-new-privs",
            "--",
        ]

    def die_with_server(self) -> list[str]:
        """An argv prefix after which the process is SIGKILLed when the server dies (set after any uid change,
        which would clear it). For unisolated commands; bubblewrap's --die-with-parent does this itself."""
        return [self.pdeathsig, "--pdeathsig", "KILL", "--"] if self.pdeathsig else []

    # --- limits ---------------------------------------------------------------------------

    def _cgroup_name(self, slot: int) -> str:
        return "rollouts-" + re.sub(r"[^A-Za-z0-9_.-]", "_", self.container_id) + f"-slot-{slot}"

    def _cgroup_dirs(self, slot: int, part: str | None = None) -> dict[str, Path]:
        """The slot's cgroup in each hierarchy, or one part of it: a command, or the session. Limits are set
        on the slot and hold for all its parts together; a part is what is killed when its command ends."""
        if not self.cgroups:
            return {}
        dirs = self.cgroups.slot_dirs(self._cgroup_name(slot))
        return {controller: directory / part for controller, directory in dirs.items()} if part else dirs

    def prepare_slot(self, slot: int) -> None:
        """Make the slot's cgroups and write its limits into them (idempotent)."""
        if self.cgroups is None:
            return
        limits, v2 = self.limits, self.cgroups.version == "v2"
        for controller, directory in self._cgroup_dirs(slot).items():
            directory.mkdir(exist_ok=True)
            if controller == "memory" and limits.memory_bytes:
                if v2:
                    _write(directory / "memory.max", limits.memory_bytes)
                    _write(directory / "memory.swap.max", 0, optional=True)
                else:  # memory+swap may never be below memory: raise it first, lower it last
                    memory, memsw = directory / "memory.limit_in_bytes", directory / "memory.memsw.limit_in_bytes"
                    raising = limits.memory_bytes > int(memory.read_text())
                    if raising:
                        _write(memsw, limits.memory_bytes, optional=True)
                    _write(memory, limits.memory_bytes)
                    if not raising:
                        _write(memsw, limits.memory_bytes, optional=True)
            elif controller == "pids" and limits.max_processes:
                _write(directory / "pids.max", limits.max_processes)
            elif controller == "cpu" and limits.cpus:
                period = 100_000
                quota = max(1000, int(limits.cpus * period))
                if v2:
                    _write(directory / "cpu.max", f"{quota} {period}")
                else:
                    _write(directory / "cpu.cfs_period_us", period)
                    _write(directory / "cpu.cfs_quota_us", quota)

    def remove_slot(self, slot: int) -> None:
        self.kill_slot(slot)
        for directory in set(self._cgroup_dirs(slot).values()):
            try:
                directory.rmdir()
            except OSError:
                pass

    def join_cgroups(self, slot: int, part: str) -> list[str]:
        """An argv prefix that moves the command into its part of the slot's cgroups before it starts
        (fails closed); the part's folders are made here."""
        dirs = self._cgroup_dirs(slot, part)
        if not dirs:
            return []
        for directory in set(dirs.values()):
            directory.mkdir(exist_ok=True)
        procs = sorted({str(directory / "cgroup.procs") for directory in dirs.values()})
        joins = "; ".join(
            f'{{ echo $$ > {shlex.quote(p)}; }} 2>/dev/null || {{ echo "sandbox: cannot join {shlex.quote(p)}" >&2; exit 125; }}'
            for p in procs
        )
        return ["/bin/sh", "-c", f'{joins}; exec "$@"', "sandbox-limits"]

    def _folders_of_part(self, slot: int, part: str) -> tuple[Path, ...]:
        """The part's folders, one per hierarchy (v2: one), remembered for the parts a slot keeps."""
        if not self.cgroups:  # none, or given up at start (`SlotManager._prepare_cgroups`)
            return ()
        key = (slot, part)
        if (folders := self._part_folders.get(key)) is None:
            folders = tuple(sorted(set(self._cgroup_dirs(slot, part).values())))
            if len(self._part_folders) >= MAX_REMEMBERED_PARTS:  # parts named per command come and go
                self._part_folders.clear()
            self._part_folders[key] = folders
        return folders

    def move_into_part(self, slot: int, part: str, pid: int) -> None:
        """Move a running process (a resident command, still waiting to start) into a part of the slot's
        cgroups, making the part's folders if need be; raises OSError if it cannot."""
        for directory in self._folders_of_part(slot, part):
            try:
                _write_pid(f"{directory}/cgroup.procs", pid)
            except FileNotFoundError:
                directory.mkdir(exist_ok=True)
                _write_pid(f"{directory}/cgroup.procs", pid)

    def part_is_empty(self, slot: int, part: str) -> bool:
        """Whether no process is left in a part (one hierarchy tells: under v1 each holds every process)."""
        folders = self._folders_of_part(slot, part)
        if not folders:
            return True
        try:
            fd = os.open(f"{folders[0]}/cgroup.procs", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return True
        try:
            return not os.read(fd, PROCS_PEEK_BYTES).strip()
        finally:
            os.close(fd)

    def kill_part(self, slot: int, part: str) -> int:
        """SIGKILL what is left in a part and keep the part for the next command; how many were signalled."""
        return sum(_kill_cgroup(directory) for directory in self._folders_of_part(slot, part))

    def end_part(self, slot: int, part: str) -> int:
        """SIGKILL what a finished command (or a stopped session) left running and remove its part;
        the slot's other parts run on. Returns how many processes were signalled."""
        dirs = set(self._cgroup_dirs(slot, part).values())
        killed = sum(_kill_cgroup(directory) for directory in dirs)
        for directory in dirs:
            with contextlib.suppress(OSError):
                directory.rmdir()
        return killed

    @contextlib.contextmanager
    def watched(self, slot: int, pid: int) -> Iterator[None]:
        """While the block runs, `pid` (a sandbox: a command's, the terminal's, the launcher's) is one of the
        slot's, which `stop_slot` kills, and it and what it starts count against the slot's limits in the
        watchdog (where no cgroup holds the slot's memory or CPU)."""
        sandboxes = self._sandboxes.setdefault(slot, set())
        sandboxes.add(pid)
        try:
            with self.watchdog.watch(slot, pid) if self.watchdog is not None else contextlib.nullcontext():
                yield
        finally:
            sandboxes.discard(pid)

    def stops(self, slot: int) -> int:
        """How many times the slot's processes were stopped for a limit: a command that died before it ran
        while this changed was stopped, not a sandbox that failed to start."""
        return self._stops.get(slot, 0)

    def has_processes(self, slot: int) -> bool:
        """Whether the slot has a sandbox running (a command, its terminal, its launcher)."""
        return bool(self._sandboxes.get(slot))

    def stop_slot(self, slot: int) -> int:
        """SIGKILL every process of the slot (a limit it passed): every part of its cgroups, every sandbox it
        runs (its pid namespace dies with it), and without cgroups every process of its own uid. The calls
        waiting on them return; its terminal and launcher start afresh on the next call."""
        self._stops[slot] = self._stops.get(slot, 0) + 1
        killed = self.kill_slot(slot)
        for pid in list(self._sandboxes.get(slot, ())):
            try:
                os.killpg(pid, signal.SIGKILL)
                killed += 1
            except ProcessLookupError:
                killed += _signal(pid, signal.SIGKILL)
            except PermissionError:
                pass
        if self.dedicated_uids and not self.cgroups:
            killed += sum(_signal(pid, signal.SIGKILL) for pid in pids_of_uid(self.uid(slot)))
        return killed

    def notices(self, slot: int) -> str:
        """What the watchdog did to the slot since last asked ("" if nothing), for the next result."""
        return self.watchdog.take_notices(slot) if self.watchdog is not None else ""

    def rlimits(self) -> list[str]:
        """An argv prefix setting the per-process limits (prlimit from util-linux)."""
        if self.prlimit is None:
            return []
        limits, cgroup = self.limits, self._cgroup_controllers()
        options = ["--core=0"]
        if limits.file_size_bytes:
            options.append(f"--fsize={limits.file_size_bytes}")
        if limits.cpu_time_limit_s:
            options.append(f"--cpu={limits.cpu_time_limit_s}")
        if limits.memory_bytes and "memory" not in cgroup:
            options.append(f"--as={limits.memory_bytes}")
        if limits.max_processes and "pids" not in cgroup:
            # RLIMIT_NPROC counts every process of the uid: with a shared uid, allow what runs now plus the limit.
            base = 0 if self.dedicated_uids else processes_of_uid(os.getuid())
            options.append(f"--nproc={base + limits.max_processes}")
        return [self.prlimit, *options, "--"]

    def _cgroup_controllers(self) -> set[str]:
        return set(self.cgroups.parents) if self.cgroups else set()

    def kill_slot(self, slot: int) -> int:
        """SIGKILL every process left in the slot's cgroups, every part included; returns how many were signalled."""
        killed = 0
        for directory in set(self._cgroup_dirs(slot).values()):
            parts = [child for child in directory.iterdir() if child.is_dir()] if directory.is_dir() else []
            for part in parts:
                killed += _kill_cgroup(part)
                with contextlib.suppress(OSError):
                    part.rmdir()
            killed += _kill_cgroup(directory)
        return killed

    def kill_uid(self, slot: int) -> int:
        """SIGKILL every process of the slot's own uid on this host, wherever it runs (a slot of a root-run
        server; with a shared uid nothing is signalled, and `kill_slot` is what reaches its processes).
        A process of that uid calls kill(-1): the kernel signals every process it may signal while it
        holds the task list, so no fork slips between a scan and a kill. Returns the tasks the uid had."""
        if not self.dedicated_uids:
            return 0
        uid = self.uid(slot)
        running = processes_of_uid(uid)
        if running:
            killer = ["/bin/sh", "-c", "kill -KILL -1 2>/dev/null; true"]
            subprocess.run(
                killer,
                user=uid,
                group=self.gid(slot),
                extra_groups=[],
                cwd="/",
                env={},
                stdin=subprocess.DEVNULL,
                capture_output=True,
                check=False,
                timeout=30,
            )
        return running

    def unwatched_limits(self) -> set[str]:
        """The slot-wide limits no cgroup holds here, which the watchdog must: "memory", "cpus"."""
        cgroup = self._cgroup_controllers()
        return {
            name
            for name, controller, value in (
                ("memory", "memory", self.limits.memory_bytes),
                ("cpus", "cpu", self.limits.cpus),
            )
            if value and controller not in cgroup
        }

    def _uids_in_force(self) -> str:
        if not self.dedicated_uids:
            return f"server uid {os.getuid()} (slots share it)"
        last = self.uid_base + self.uid_count - 1
        claimed = ", ".join(f"{slot}:{uid}" for slot, uid in sorted(self.slot_uids.items()))
        return f"dedicated uid per slot, claimed on this host from {self.uid_base}-{last} (slot:uid {claimed})"

    def in_force(self, tmp_sized: bool) -> dict[str, str]:
        """For /health: each limit and the mechanism enforcing it ("off" when none)."""
        limits, cgroup = self.limits, self._cgroup_controllers()
        version = self.cgroups.version if self.cgroups else ""
        rlimit = self.prlimit is not None

        nproc = None
        if rlimit:
            nproc = "rlimit-nproc" if self.dedicated_uids else "rlimit-nproc (shared uid: running processes + limit)"

        def pick(value: float, controller: str, fallback: str | None) -> str:
            if not value:
                return "off"
            if controller in cgroup:
                return f"cgroup-{version}"
            return fallback or "off"

        watchdog = self.watchdog is not None
        total = "watchdog (slot total: private pages, shared memory, memfds, tmpfs)"
        memory = (
            f"{total} + rlimit-as (each process)"
            if watchdog and rlimit
            else (total if watchdog else "rlimit-as (each process)" if rlimit else None)
        )
        return {
            "uid": self._uids_in_force(),
            "memory": pick(limits.memory_bytes, "memory", memory),
            "processes": pick(limits.max_processes, "pids", nproc),
            "cpus": pick(limits.cpus, "cpu", "watchdog (pauses the slot past its share)" if watchdog else None),
            "cpu_time": "rlimit-cpu" if limits.cpu_time_limit_s and rlimit else "off",
            "file_size": "rlimit-fsize" if limits.file_size_bytes and rlimit else "off",
            "tmp": "tmpfs-size" if limits.tmp_bytes and tmp_sized else "off",
            "wall_time": "timeout kills the tree" + (" and the slot cgroup" if cgroup else ""),
        }

    def not_held(self) -> dict[str, str]:
        """For /health: what escapes a limit here, by limit (none where a cgroup holds it)."""
        if not self.limits.memory_bytes or "memory" in self._cgroup_controllers():
            return {}
        if self.watchdog is None:
            return {"memory": "no memory cgroup and no watchdog: only each process's address space is capped"}
        return {
            "memory": "no memory cgroup: the watchdog does not see SysV shared memory that no process has "
            "attached, nor kernel memory (page tables, socket buffers)"
        }


def _kill_cgroup(directory: Path) -> int:
    """SIGKILL the processes in one cgroup until it is empty (or stays unreadable); how many were signalled."""
    killed = 0
    procs_file = directory / "cgroup.procs"
    for _ in range(KILL_ROUNDS):
        try:
            pids = [int(p) for p in procs_file.read_text().split()]
        except (OSError, ValueError):
            break
        if not pids:
            break
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
        time.sleep(0.01)
    return killed


def _write_pid(procs: str | Path, pid: int) -> None:
    fd = os.open(procs, os.O_WRONLY)
    try:
        os.write(fd, str(pid).encode())
    finally:
        os.close(fd)


def _write(path: Path, value: object, optional: bool = False) -> None:
    try:
        path.write_text(str(value))
    except OSError as err:
        if not optional:
            raise
        log.debug("cannot set %s: %s", path, err)


def _signal(pid: int, signum: int) -> int:
    try:
        os.kill(pid, signum)
        return 1
    except (ProcessLookupError, PermissionError):
        return 0


def pids_of_uid(uid: int) -> list[int]:
    """The processes `uid` runs now."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if entry.stat().st_uid == uid:
                    found.append(int(entry.name))
    return found


def processes_of_uid(uid: int) -> int:
    """Tasks (threads included, as RLIMIT_NPROC counts them) that `uid` runs now."""
    count = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    count += int(Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[17])
            except (OSError, IndexError, ValueError):
                pass
    return count
