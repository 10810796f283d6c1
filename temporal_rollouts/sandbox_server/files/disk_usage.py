"""What a slot's workspace holds, measured (a statfs of its own filesystem) or walked, and which limit it is past."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from temporal_rollouts.sandbox_server.config import MIB, SlotLimits

FULL_MARGIN_BYTES = MIB
"""A filesystem of its own with less free than this (or a sixty-fourth of its size) is full: a write was refused."""
MAX_DEPTH_SHOWN = 2048

Passed = Literal["disk", "files", "depth"]


@dataclass(frozen=True)
class DiskUsage:
    """Bytes and files (inodes) in a slot's workspace; for a filesystem of its own, also what is free."""

    bytes: int = 0
    files: int = 0
    free_bytes: int | None = None
    free_files: int | None = None
    too_deep: bool = False
    """A walk met folders deeper than it goes: what lies below was not counted."""
    cut: bool = False
    """A walk stopped at the file limit: there are more files than it counted."""

    def passed(self, limits: SlotLimits, files_limit: int) -> Passed | None:
        """The limit the workspace is past: its disk, its file count, or a tree too deep to count; else None."""
        if self.too_deep:
            return "depth"
        margin = min(FULL_MARGIN_BYTES, limits.disk_bytes // 64)
        if limits.disk_bytes and (
            self.bytes > limits.disk_bytes or (self.free_bytes is not None and self.free_bytes < margin)
        ):
            return "disk"
        if files_limit and (self.cut or self.files > files_limit or self.free_files == 0):
            return "files"
        return None


def describe_passed(passed: Passed, limits: SlotLimits, files_limit: int) -> str:
    """The limit, as the agent reads it in a notice."""
    if passed == "disk":
        return f"its disk limit of {limits.disk_limit_mb} MiB"
    if passed == "files":
        return f"its limit of {files_limit} files and folders"
    return f"what the server counts: a folder tree deeper than {MAX_DEPTH_SHOWN} levels"
