"""Files the worker builds to send to sandboxes (a repository's bundle, a cache entry's archive), kept
while they are likely to be sent again and removed when they are not.

Building an entry costs a `git clone --mirror` and a tar.gz (about a second, 0.5 MB), so a worker
keeps the last few per process. They used to go to folders of their own in the host's temp dir
that nothing ever removed: not when the in-process cache dropped one, not at exit. A long run over
many repositories, with worker restarts, grew without bound. Now every process builds in one
folder of its own (`rollouts-swe-<random>` in the temp dir), holding an `flock` on its `.lock`
for as long as it runs: an entry's folder goes when the cache drops it, the whole folder at exit,
and the folder of a process that died without exiting (SIGKILL, a crash) is removed by whichever
process builds here next (every build sweeps), which finds its lock free.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from pathlib import Path
from typing import Generic, TypeVar

PREFIX = "rollouts-swe-"
LOCK = ".lock"
STARTING_S = 10.0
"""A folder younger than this may belong to a process that has not locked it yet: left alone."""

V = TypeVar("V")


class _ProcessFolder:
    """The folder this process builds in, made on first use; removed at exit. Asking for it sweeps the
    folders of processes that are gone."""

    def __init__(self) -> None:
        self._path: Path | None = None
        self._lock_fd: int | None = None
        self._guard = threading.Lock()

    def path(self) -> Path:
        with self._guard:
            parent = Path(tempfile.gettempdir())
            sweep(parent)
            if self._path is None or not self._path.is_dir():
                self._path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
                self._lock_fd = os.open(self._path / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
                fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                atexit.register(self.remove)
            return self._path

    def remove(self) -> None:
        with self._guard:
            if self._path is not None:
                shutil.rmtree(self._path, ignore_errors=True)
                self._path = None
            if self._lock_fd is not None:
                os.close(self._lock_fd)
                self._lock_fd = None


PROCESS_FOLDER = _ProcessFolder()


def sweep(parent: Path) -> list[Path]:
    """Remove the build folders in `parent` of processes that are gone; returns them."""
    removed = []
    for folder in parent.glob(f"{PREFIX}*"):
        try:
            if time.time() - folder.stat().st_mtime < STARTING_S:
                continue
            fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # its process runs
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


class ScratchCache(Generic[V]):
    """The last `capacity` things built, by key; each is built in a folder of its own (`build(folder)`),
    removed when the thing is dropped. Thread-safe: builds run one at a time (they run in worker threads)."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name, self.capacity = name, capacity
        self._entries: OrderedDict[Hashable, tuple[Path, V]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, build: Callable[[Path], V]) -> V:
        with self._lock:
            if (found := self._entries.get(key)) is not None and found[0].is_dir():
                self._entries.move_to_end(key)
                return found[1]
            folder = Path(tempfile.mkdtemp(prefix=f"{self.name}-", dir=PROCESS_FOLDER.path()))
            try:
                value = build(folder)
            except BaseException:
                shutil.rmtree(folder, ignore_errors=True)
                raise
            self._entries[key] = (folder, value)
            while len(self._entries) > self.capacity:
                dropped, _ = self._entries.popitem(last=False)[1]
                shutil.rmtree(dropped, ignore_errors=True)
            return value

    def clear(self) -> None:
        with self._lock:
            while self._entries:
                with contextlib.suppress(OSError):
                    shutil.rmtree(self._entries.popitem()[1][0])
