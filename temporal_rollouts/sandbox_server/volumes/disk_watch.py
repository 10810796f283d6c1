"""What a slot's workspace holds, and when it is walked.

A volume that is a filesystem of its own (`slot_volume`) is measured with one statfs, after every
operation and by the disk guard a few times a second: no walk, whatever the agent made. Its
setuid bits mean nothing (it is mounted nosuid on the host, and every sandbox binds it nosuid),
but the walk that strips them (`workspace.settle`) still runs after each command that could set them
(hooks, or any command where `syscall_filter` is not loaded), as on every volume.

A `checked` volume is walked to be counted: one stat per entry, by descriptor, about 4 us each
here. Every walk stops past the slot's file limit, so it costs at most that many entries. After a
command that could set no bit it is paced by its own cost: the workspace is walked again once the
slot's operations have run `PACE` times as long as the last walk took, and the disk guard walks
it in the background once `PACE` times as long has passed on the clock, so walks take under
1/PACE of the slot's time and of the server's. It is walked at once on first use and after
anything changed the workspace from outside a command (an upload, a copy).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from temporal_rollouts.sandbox_server.config import MIB, SlotLimits
from temporal_rollouts.sandbox_server.files.disk_usage import DiskUsage, Passed
from temporal_rollouts.sandbox_server.files.workspace import settle
from temporal_rollouts.sandbox_server.volumes.slot_volume import SlotVolume

PACE = 20.0
"""A walk is due once the slot's operations (or, in the background, the clock) ran this many times as long as it took."""
REGROWTH = 0.01
"""A slot past a limit has its processes stopped again once it grew by this share of the limit since."""
MIN_BACKGROUND_S = 1.0
"""The background walks of a checked volume are at least this far apart."""


@dataclass
class DiskWatch:
    usage: DiskUsage = field(default_factory=DiskUsage)
    """What the workspace held at the last measure or walk, plus what file writes added since."""
    walk_s: float = 0.0
    ran_s: float = 0.0
    """How long the slot's operations ran since the last walk."""
    walked_at: float = 0.0
    """When the last walk ended (monotonic)."""
    fresh: bool = False
    """Whether `usage` comes from a walk of this workspace as it now stands, but for the slot's own operations."""
    walks: int = 0
    stopped_at: DiskUsage | None = None
    """The usage at which the slot's processes were last stopped for a limit; None while it is under them."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def changed(self) -> None:
        """Something outside the slot's operations changed the workspace (an upload, a reset): walk next time."""
        self.fresh = False

    def due(self, ran_s: float, bits_refused: bool, counting: bool) -> bool:
        """Whether to walk after an operation that ran `ran_s`; `bits_refused`: it could set no setuid bit;
        `counting`: the volume is counted by walking it."""
        self.ran_s += ran_s
        if not bits_refused:  # the walk strips whatever bits the command may have set
            return True
        if not counting:
            return False
        return not self.fresh or self.ran_s >= PACE * self.walk_s

    async def after(self, volume: SlotVolume, ran_s: float, *, bits_refused: bool, limits: SlotLimits) -> DiskUsage:
        """The workspace's usage after an operation that ran `ran_s`, walking it if a walk is due."""
        async with self.lock:
            measured = volume.measure()  # one statfs, or None
            if self.due(ran_s, bits_refused, measured is None and _counted(limits)):
                walked = await self._walk(volume, limits)
                if measured is None:
                    self.usage = walked
            if measured is not None:
                self.usage = measured
            return self.usage

    async def background(self, volume: SlotVolume, limits: SlotLimits) -> DiskUsage | None:
        """For the disk guard: the usage now (a statfs), or by a walk when one is due by the clock; None when
        nothing was measured."""
        async with self.lock:
            if (measured := volume.measure()) is not None:
                self.usage = measured
                return measured
            if not _counted(limits) or time.monotonic() < self.walked_at + max(MIN_BACKGROUND_S, PACE * self.walk_s):
                return None
            self.usage = await self._walk(volume, limits)
            return self.usage

    def judge(self, usage: DiskUsage, volume: SlotVolume, limits: SlotLimits) -> tuple[Passed | None, bool]:
        """The limit `usage` is past (None: none), and whether to stop the slot's processes for it now: once
        when it passes, and for a checked volume again if it grew by `REGROWTH` of the limit since (a writer
        started again)."""
        passed = usage.passed(limits, volume.files_limit(limits))
        if passed is None:
            self.stopped_at = None
            return None, False
        last = self.stopped_at
        regrown = last is None or (  # a filesystem of its own cannot grow past full: once per crossing
            not volume.own_filesystem
            and (
                usage.bytes > last.bytes + REGROWTH * limits.disk_bytes + MIB
                or usage.files > last.files + REGROWTH * volume.files_limit(limits) + 1
            )
        )
        if regrown:
            self.stopped_at = usage
        return passed, regrown

    def wrote(self, size: int) -> None:
        """A file write the server made: counted as growth until the next walk (an overwrite overcounts)."""
        self.usage = DiskUsage(bytes=self.usage.bytes + size, files=self.usage.files + 1)

    async def _walk(self, volume: SlotVolume, limits: SlotLimits) -> DiskUsage:
        """Walk the workspace, stripping privilege bits, and stop past the file limit: its cost is what the
        limit allows. A slot that made more files is past its limit (its processes stopped), and what the
        walk did not reach keeps its bits, in a folder only the slot's uid may enter, bound nosuid into
        every sandbox."""
        started = time.monotonic()
        usage = await asyncio.to_thread(settle, volume.tree, volume.files_limit(limits))
        self.walked_at = time.monotonic()
        self.walk_s, self.ran_s, self.fresh = self.walked_at - started, 0.0, True
        self.walks += 1
        return usage


def _counted(limits: SlotLimits) -> bool:
    return bool(limits.disk_bytes or limits.max_files)
