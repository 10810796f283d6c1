"""Per-slot memory and CPU limits where no cgroup enforces them.

Without delegated cgroups (most containers of the remote backends) the kernel only limits each
process: RLIMIT_AS lets four 150 MB processes live in a slot of 256 MB, and nothing shares CPU
between slots. This watchdog makes both limits hold for the slot as a whole, a few times a second:

- a slot's processes are those of its uid where slots have their own uids (a root-run server),
  else the descendants of the commands and the session it started (every command runs in its own
  pid namespace, so nothing it starts can leave that tree);
- memory: their private pages (RssAnon + RssFile, so page cache of a file mapped by several counts
  once per process: the sum errs high) and the shared memory they hold, each object once: memfds,
  SysV segments, shared mappings, and the tmpfs mounts of their sandboxes (`shared_memory` says how,
  and what it cannot see). When that passes the slot's limit, the process holding the most is
  killed, as the kernel's OOM killer would in a cgroup, until the rest fits (memory of a sandbox's
  tmpfs goes when its last process does); the next result of the slot says so;
- CPU: CPU time used beyond `cpus` cores over an interval is paid back by stopping the slot's
  processes (SIGSTOP, then SIGCONT) for that long, a coarse version of the cgroup CPU quota.

It costs one pass over /proc per interval, only while some slot runs something.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from temporal_rollouts.sandbox_server.limits.shared_memory import FDS_PER_PASS, Held, Key, MountCache, held_by

log = logging.getLogger(__name__)

INTERVAL_S = 0.2
MAX_NAMESPACES_REMEMBERED = 4096
MAX_PAUSE_S = 1.0
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
MIB = 1024 * 1024


@dataclass(frozen=True)
class Process:
    pid: int
    parent: int
    uid: int
    cpu_ticks: int


@dataclass(frozen=True)
class SlotRule:
    """What the watchdog holds one slot to: its uid (None when slots share the server's) and limits."""

    uid: int | None
    memory_bytes: int
    cpus: float


@dataclass
class _Watched:
    roots: set[int] = field(default_factory=set)
    ticks: dict[int, int] = field(default_factory=dict)
    notices: list[str] = field(default_factory=list)
    paused_until: float = 0.0


class Watchdog:
    """Holds slots to `rule_of(slot)` while they have something running (`watch`)."""

    def __init__(self, rule_of: Callable[[int], SlotRule], interval_s: float = INTERVAL_S) -> None:
        self.rule_of = rule_of
        self.interval_s = interval_s
        self._slots: dict[int, _Watched] = {}
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._mounts = MountCache()
        self._passes = 0

    @contextlib.contextmanager
    def watch(self, slot: int, pid: int) -> Iterator[None]:
        """Count `pid` (a command or the session, and what it starts) as the slot's while the block runs."""
        watched = self._slots.setdefault(slot, _Watched())
        watched.roots.add(pid)
        self._wake.set()
        try:
            yield
        finally:
            watched.roots.discard(pid)

    def take_notices(self, slot: int) -> str:
        """What the watchdog did to the slot since it was last asked, as a line for the agent ("" if nothing)."""
        watched = self._slots.get(slot)
        if watched is None or not watched.notices:
            return ""
        notes, watched.notices = watched.notices, []
        return "\n[sandbox: " + "; ".join(dict.fromkeys(notes)) + "]"

    def forget(self, slot: int) -> None:
        """The slot was reset: whatever it ran is gone, and so is what the watchdog knew of it."""
        self._slots.pop(slot, None)

    async def run_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            if not any(w.roots for w in self._slots.values()):
                self._wake.clear()
                await self._wake.wait()
            await asyncio.sleep(self.interval_s)
            try:
                processes = await asyncio.to_thread(read_processes)
                for slot, watched in list(self._slots.items()):
                    if watched.roots:
                        await self._enforce(slot, watched, processes, loop)
            except Exception:
                log.exception("the slot watchdog's pass failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self.run_forever())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None

    async def _enforce(
        self, slot: int, watched: _Watched, processes: dict[int, Process], loop: asyncio.AbstractEventLoop
    ) -> None:
        rule = self.rule_of(slot)
        mine = slot_processes(processes, watched.roots, rule.uid)
        if rule.cpus:  # first: its pause is due now, and the memory count reads more of /proc (off the loop)
            self._hold_cpu(watched, mine, rule.cpus, loop)
        if rule.memory_bytes:
            held = await asyncio.to_thread(self._held, mine)
            self._hold_memory(watched, held, rule.memory_bytes)

    def _held(self, mine: list[Process]) -> dict[int, Held]:
        if len(self._mounts.tmpfs) > MAX_NAMESPACES_REMEMBERED:
            self._mounts.tmpfs.clear()
        if len(self._mounts.fds) > MAX_NAMESPACES_REMEMBERED:
            self._mounts.forget_others({p.pid for p in mine})
        self._mounts.budget = FDS_PER_PASS
        self._passes += 1
        start = self._passes % len(mine) if mine else 0  # each pass's budget goes first to another process
        ordered = mine[start:] + mine[:start]
        return {p.pid: held for p in ordered if (held := held_by(p.pid, self._mounts)) is not None}

    def _hold_memory(self, watched: _Watched, held: dict[int, Held], limit: int) -> None:
        """Kill the process holding the most until the slot's memory fits; a shared object leaves the total
        with the last process that held it."""
        sizes: dict[Key, int] = {}
        holders: dict[Key, int] = {}
        for process in held.values():
            for key, size in process.shared.items():
                sizes[key] = size
                holders[key] = holders.get(key, 0) + 1
        total = sum(p.private for p in held.values()) + sum(sizes.values())
        left = dict(held)
        while total > limit and left:
            pid, process = max(left.items(), key=lambda item: item[1].private + sum(item[1].shared.values()))
            del left[pid]
            if _signal(pid, signal.SIGKILL):
                using = process.private + sum(process.shared.values())
                watched.notices.append(
                    f"killed a process holding {using // MIB} MiB (its own memory and the shared memory, memfds "
                    f"and tmpfs files it held): the slot's processes went over its memory limit of {limit // MIB} MiB"
                )
            total -= process.private
            for key in process.shared:
                holders[key] -= 1
                if not holders[key]:
                    total -= sizes[key]

    def _hold_cpu(self, watched: _Watched, mine: list[Process], cpus: float, loop: asyncio.AbstractEventLoop) -> None:
        used = sum(max(p.cpu_ticks - watched.ticks.get(p.pid, 0), 0) for p in mine)
        watched.ticks = {p.pid: p.cpu_ticks for p in mine}
        allowed = cpus * self.interval_s * TICKS_PER_S
        if used <= allowed or loop.time() < watched.paused_until:
            return
        pause = min((used - allowed) / (cpus * TICKS_PER_S), MAX_PAUSE_S)
        stopped = [p.pid for p in mine if _signal(p.pid, signal.SIGSTOP)]
        watched.paused_until = loop.time() + pause
        loop.call_later(pause, _resume, stopped)


def slot_processes(processes: dict[int, Process], roots: set[int], uid: int | None) -> list[Process]:
    """A slot's processes: those of its uid, or (slots sharing a uid) the trees under its roots."""
    if uid is not None:
        return [p for p in processes.values() if p.uid == uid]
    children: dict[int, list[int]] = {}
    for process in processes.values():
        children.setdefault(process.parent, []).append(process.pid)
    found, pending = [], [pid for pid in roots if pid in processes]
    seen = set(pending)
    while pending:
        pid = pending.pop()
        found.append(processes[pid])
        for child in children.get(pid, []):
            if child not in seen:
                seen.add(child)
                pending.append(child)
    return found


def read_processes() -> dict[int, Process]:
    """Every process of this host (or pid namespace) that can be read now."""
    found = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as file:
                fields = file.read().rsplit(b")", 1)[1].split()
            uid = entry.stat().st_uid
        except (OSError, IndexError):
            continue  # exited while we looked
        pid = int(entry.name)
        found[pid] = Process(
            pid=pid,
            parent=int(fields[1]),
            uid=uid,
            cpu_ticks=int(fields[11]) + int(fields[12]),
        )
    return found


def _resume(pids: list[int]) -> None:
    for pid in pids:
        _signal(pid, signal.SIGCONT)


def _signal(pid: int, signum: int) -> bool:
    try:
        os.kill(pid, signum)
        return True
    except (ProcessLookupError, PermissionError):
        return False
