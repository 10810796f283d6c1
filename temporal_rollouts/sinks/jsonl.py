"""A JSONL file of scored groups, appended once per group whatever retries, workers or resumes do.

Appends are guarded by a file lock and an index of written group ids beside the file
(`<file>.index`); a second index (`<file>.posted`) marks the groups Atropos' run-api
accepted, under the same lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

INDEX, POSTED = ".index", ".posted"


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The file lock every writer of `path` and its indexes holds (workers, retries). The folder is
    made here: any worker may write a group, and on another host the folder open_sink made is not there."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(_beside(path, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def marked(path: Path, suffix: str, key: str) -> bool:
    marks = _beside(path, suffix)
    return marks.exists() and key in marks.read_text().split()


def _mark(path: Path, suffix: str, key: str) -> None:
    with open(_beside(path, suffix), "a") as marks:
        marks.write(key + "\n")


def mark_locked(path: Path, suffix: str, key: str) -> None:
    with _locked(path):
        _mark(path, suffix, key)


def append_once(path: Path, key: str, line: str) -> bool:
    """Append `line` unless `key` was appended before; True when written."""
    with _locked(path):
        if marked(path, INDEX, key):
            return False
        with open(path, "a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        _mark(path, INDEX, key)
        return True


def read_groups(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
