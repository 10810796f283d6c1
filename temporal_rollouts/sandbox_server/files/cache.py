"""One shared, read-only cache per container: files every slot may use, put there once.

An entry is a folder under `<root>/cache/<name>`, put by the worker (who holds the token)
as a tar.gz: a bare git repository, a wheelhouse. Names are chosen by the caller and, by
convention, name their content (a digest), so the first put of a name wins and a later
put of the same name is a no-op.

Puts are atomic and serialised: the body is spooled to `.tmp-*` beside the entries, then,
holding an exclusive `flock` on `.lock` (so two requests, or two server processes on one
root, never race), the entry is checked again, unpacked into a `.tmp-*` folder and renamed
into place. A crash at any point leaves only `.tmp-*` leftovers, which names can never
match (they start with a dot) and which the next server start deletes. Entries survive
slot reset and release; they go with the container's root.

Slots never see the cache unless a command asks: an `exec` names the entries it needs
(`ExecOp.cache`) and only that one command gets them, bound read-only at `/cache/<name>`
by bubblewrap. The agent's own commands and its stateful terminal name none, so a cache
that holds, say, a repository's whole history (the fix of a bug included) or other tasks'
trees is out of its reach; and as a read-only bind it cannot be changed by any slot. Entries
are world-readable (a root-run server's slots run as other uids) and owned by the server.
Without bubblewrap (isolation explicitly off) nothing is isolated: a command sees the host,
the cache included, and could write it when it runs as the server's uid.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import os
import re
import shutil
import stat
import tarfile
import tempfile
from collections.abc import AsyncIterable, Iterator
from pathlib import Path

from temporal_rollouts.sandbox_server.files.archive import spool_body, unpack_archive
from temporal_rollouts.sandbox_server.files.beneath import open_root
from temporal_rollouts.sandbox_server.errors import BadToolRequest
from temporal_rollouts.sandbox_server.files.workspace import Trash
from temporal_rollouts.sandbox_server.schema import CACHE_NAME_PATTERN, CacheEntry

CACHE_FOLDER = "cache"
LOCK_FILE = ".lock"
TEMP_PREFIX = ".tmp-"
_NAME = re.compile(CACHE_NAME_PATTERN)


class SharedCache:
    def __init__(self, root: Path) -> None:
        self.folder = root / CACHE_FOLDER
        self.folder.mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o755)  # slots of a root-run server (other uids) must reach the entries
        with self._locked():
            for leftover in self.folder.glob(f"{TEMP_PREFIX}*"):
                _remove(leftover)

    def path(self, name: str) -> Path:
        """The host folder of an entry, which must be there."""
        entry = self.folder / _checked(name)
        if not entry.is_dir():
            raise BadToolRequest(f"the container's cache holds no entry {name!r}: put it first")
        return entry

    def get(self, name: str) -> CacheEntry:
        return CacheEntry(name=name, present=(self.folder / _checked(name)).is_dir())

    async def put(self, name: str, body: AsyncIterable[bytes], max_bytes: int) -> CacheEntry:
        """Store `body` (a tar.gz) as entry `name` unless it is there already; see the module docstring."""
        _checked(name)
        fd, spool = tempfile.mkstemp(dir=self.folder, prefix=TEMP_PREFIX)
        try:
            received = await spool_body(body, fd, max_bytes, f"the cache entry {name!r}")
            created = await asyncio.to_thread(self._place, name, Path(spool), max_bytes)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(spool)
        return CacheEntry(name=name, present=True, created=created, bytes=received if created else 0)

    def _place(self, name: str, spool: Path, max_bytes: int) -> bool:
        with self._locked():
            target = self.folder / name
            if target.is_dir():
                return False
            staging = Path(tempfile.mkdtemp(dir=self.folder, prefix=TEMP_PREFIX))
            try:
                staging_fd = open_root(staging)
                try:
                    with tarfile.open(spool, mode="r:gz") as tar:
                        unpack_archive(
                            tar, staging_fd, None, trash=Trash(self.folder, TEMP_PREFIX), replace=False, limit=max_bytes
                        )
                except tarfile.TarError as err:
                    raise BadToolRequest(f"the cache entry {name!r} cannot be unpacked: {err}") from err
                finally:
                    os.close(staging_fd)
                _make_readable(staging)
                os.rename(staging, target)
            except BaseException:
                _remove(staging)
                raise
            _sync(self.folder)
            return True

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        fd = os.open(self.folder / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _checked(name: str) -> str:
    if not _NAME.match(name):
        raise BadToolRequest(f"bad cache entry name {name!r}: letters, digits, '.', '_' and '-', not first a '.'")
    return name


def _make_readable(folder: Path) -> None:
    """Folders 0755, files 0644 (0755 when executable), so every slot's uid can read them."""
    for parent, folders, files in os.walk(folder):
        os.chmod(parent, 0o755)
        for name in files:
            path = os.path.join(parent, name)
            info = os.lstat(path)
            if stat.S_ISREG(info.st_mode):
                os.chmod(path, 0o755 if info.st_mode & 0o111 else 0o644)
        for name in folders:
            path = os.path.join(parent, name)
            if not os.path.islink(path):
                os.chmod(path, 0o755)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()


def _sync(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
