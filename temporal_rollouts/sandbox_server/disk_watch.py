"""When a slot's workspace is walked: after every command that could set setuid bits, paced after the rest.

The walk (`files.settle`: one stat per entry, by descriptor) counts the bytes the workspace holds
for the disk limit and strips setuid and setgid bits. Its cost grows with the workspace: about
4 us of stat calls per entry here, so 15 CPU-ms after every `ls` on a checkout of 3,400 files.
After a command run where those bits are refused at the syscall (the agent's sandboxes, under
`syscall_filter`), the walk is needed only for the disk limit, which was never a quota (one command
can write past it before any check), so it is paced by its own cost: the workspace is walked again
once the slot's operations have run `PACE` times as long as the last walk took, which keeps walks
under 1/PACE of the slot's time. It is walked after every command that could set the bits (hooks,
or any command where the filter is not loaded), while the workspace is over its limit (so the
notice goes as soon as the agent deletes), on first use, and after anything changed the workspace
from outside a command (an upload, a copy).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.sandbox_server.files import settle

PACE = 20.0
"""A walk is due once the slot's operations ran this many times as long as the last walk took."""


@dataclass
class DiskWatch:
    used: int = 0
    """Bytes the workspace held at the last walk, plus what file writes added since."""
    walk_s: float = 0.0
    ran_s: float = 0.0
    """How long the slot's operations ran since the last walk."""
    fresh: bool = False
    """Whether `used` comes from a walk of this workspace as it now stands, but for the slot's own operations."""

    def changed(self) -> None:
        """Something outside the slot's operations changed the workspace (an upload, a reset): walk next time."""
        self.fresh = False

    def due(self, ran_s: float, bits_refused: bool, limit: int) -> bool:
        """Whether to walk after an operation that ran `ran_s`; `bits_refused`: it could set no setuid bit."""
        self.ran_s += ran_s
        if not bits_refused:  # the walk strips whatever bits the command may have set
            return True
        if not limit:  # nothing to count
            return False
        return not self.fresh or self.used > limit or self.ran_s >= PACE * self.walk_s

    async def usage(self, workspace: Path, ran_s: float, *, bits_refused: bool, limit: int) -> int:
        """The workspace's bytes after an operation that ran `ran_s`, walking it if a walk is due."""
        if self.due(ran_s, bits_refused, limit):
            started = time.monotonic()
            self.used = await asyncio.to_thread(settle, workspace)
            self.walk_s, self.ran_s, self.fresh = time.monotonic() - started, 0.0, True
        return self.used

    def wrote(self, size: int) -> None:
        """A file write the server made: counted as growth until the next walk (an overwrite overcounts)."""
        self.used += size
