"""The worker's side of file transfer: local files and folders to and from a slot, through temp files.

A folder travels as a tar stream. It is packed into a temporary file before the upload
and a downloaded one is spooled to a temporary file before it is unpacked, so memory
holds one chunk at a time and a retried request (after the pool restarted a dead
sandbox server) simply streams the same file again. Unpacking refuses members that
would land outside the destination, so a slot's files cannot write anywhere else on
the worker.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from temporal_rollouts.core.errors import BadToolRequest


@contextlib.contextmanager
def temp_path(near: Path | None = None, suffix: str = "") -> Iterator[Path]:
    """A path for a temporary file (beside `near` when given, so a rename into place stays on one disk)."""
    directory = near.parent if near is not None else None
    if directory is not None:
        directory.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=directory, prefix=".transfer-", suffix=suffix)
    os.close(fd)
    try:
        yield Path(name)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name)


def pack_folder(folder: Path, archive: Path) -> None:
    """A local folder as an uncompressed tar, members named relative to it."""
    with tarfile.open(archive, "w:") as tar:
        for path in sorted(folder.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False)


def unpack_folder(archive: Path, destination: Path) -> int:
    """Unpack a downloaded tar into `destination` (created if missing); the number of members."""
    destination.mkdir(parents=True, exist_ok=True)
    try:
        with tarfile.open(archive, "r:*") as tar:
            members = tar.getmembers()
            tar.extractall(destination, members=members, filter="data")
    except tarfile.FilterError as err:
        raise BadToolRequest(f"the downloaded folder holds an entry that would land outside it: {err}") from err
    return len(members)


def move_into_place(source: Path, destination: Path) -> None:
    destination.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(source, destination)
