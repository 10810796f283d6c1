"""Files and folders in and out of a slot, streamed: no payload is ever held whole in memory.

An upload's body is read chunk by chunk into a spool file beside the workspace (outside
it, so the slot's commands never see a half-written upload), counted against its size
limit as it arrives, and only then moved or unpacked into place. A download streams a
file straight from an open descriptor, or a folder as a tar built into a spool file
first. Memory stays at a chunk or two whatever the size; disk holds at most one spool
per transfer, bounded by the same limit.

Paths go through `files.resolve_in_workspace`, so a transfer can never reach outside
the workspace, and unpacking refuses tar members that would (absolute paths, `..`,
links pointing out, devices), as restoring a snapshot always did. A snapshot for resume
is a download of the whole workspace as tar.gz, and its restore an upload with
`replace`: one streaming path for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import tarfile
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path

from temporal_rollouts.sandbox_server.archive import pack_folder, spool_body, unpack_archive
from temporal_rollouts.sandbox_server.errors import BadToolRequest, TransferTooLarge
from temporal_rollouts.sandbox_server.execution import Slot
from temporal_rollouts.sandbox_server.files import (
    resolve_in_workspace,
    sandbox_view,
)
from temporal_rollouts.sandbox_server.schema import (
    FileEntry,
    FileListing,
    ListQuery,
    TransferFormat,
    TransferQuery,
    TransferResult,
)

CHUNK_BYTES = 1024 * 1024
SPOOL_DIR = ".transfers"
_swept: set[Path] = set()
"""Spool folders this process has emptied of what an earlier (crashed) process left behind."""


def spool_dir(slot: Slot) -> Path:
    """Beside the workspace, never inside it: the slot's commands cannot see or race a spool."""
    directory = slot.workspace.parent / SPOOL_DIR
    directory.mkdir(parents=True, exist_ok=True)
    if directory not in _swept:  # before this process's first spool there, so only leftovers go
        _swept.add(directory)
        for leftover in directory.iterdir():
            leftover.unlink(missing_ok=True)
    return directory


async def receive(
    slot: Slot, query: TransferQuery, body: AsyncIterable[bytes], max_bytes: int, owner: tuple[int, int] | None = None
) -> TransferResult:
    """Write an upload into the slot: a file at `query.path`, or a tar stream unpacked under it."""
    limit = min(query.max_bytes, max_bytes)
    target = resolve_in_workspace(slot.workspace, query.path)
    fd, spool = tempfile.mkstemp(dir=spool_dir(slot), prefix="up-")
    try:
        received = await spool_body(body, fd, limit, f"the upload to {query.path!r}")
        async with slot.lock:
            if query.format == "file":
                await asyncio.to_thread(_place_file, Path(spool), target, slot.workspace, owner)
                entries = 1
            else:
                entries = await asyncio.to_thread(
                    _unpack, Path(spool), target, query.format, limit, query.replace, owner
                )
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spool)
    return TransferResult(path=sandbox_view(slot.workspace, target), bytes=received, entries=entries)


async def send(slot: Slot, query: TransferQuery, max_bytes: int) -> tuple[AsyncIterator[bytes], int, str]:
    """What a download streams: (chunks, size, kind). A file comes as its bytes, read through a descriptor
    opened now, so a later change to the workspace cannot redirect it; a folder as a tar (gzipped when
    the format says tar.gz), packed into a spool first."""
    limit = min(query.max_bytes, max_bytes)
    target = resolve_in_workspace(slot.workspace, query.path)
    shown = sandbox_view(slot.workspace, target)
    if not target.exists():
        raise BadToolRequest(f"no such file or folder: {shown}")
    if target.is_dir():
        fd, spool = tempfile.mkstemp(dir=spool_dir(slot), prefix="down-")
        os.close(fd)
        try:
            async with slot.lock:
                await asyncio.to_thread(_pack, target, Path(spool), query.format, limit)
            source = os.open(spool, os.O_RDONLY)
        finally:
            os.unlink(spool)  # the open descriptor keeps the data until the stream ends
        return _stream(source), os.fstat(source).st_size, "dir"
    source = _open_regular(target, shown)
    size = os.fstat(source).st_size
    if size > limit:
        os.close(source)
        raise TransferTooLarge(f"{shown} is {size} bytes, over the download limit of {limit}")
    return _stream(source), size, "file"


def list_entries(slot: Slot, query: ListQuery) -> FileListing:
    """The files under a workspace folder (a slot's artifacts), without following links."""
    top = resolve_in_workspace(slot.workspace, query.path)
    shown = sandbox_view(slot.workspace, top)
    if not top.is_dir():
        raise BadToolRequest(f"{shown} is not a folder")
    entries: list[FileEntry] = []
    for parent, folders, files in os.walk(top):
        folders.sort()
        for name in sorted(folders) + sorted(files):
            path = os.path.join(parent, name)
            if len(entries) >= query.max_entries:
                return FileListing(path=shown, entries=entries, truncated=True)
            info = os.lstat(path)
            kind = (
                "link" if stat.S_ISLNK(info.st_mode)
                else "dir" if stat.S_ISDIR(info.st_mode)
                else "file" if stat.S_ISREG(info.st_mode)
                else "other"
            )  # fmt: skip
            size = info.st_size if kind == "file" else 0
            entries.append(FileEntry(path=os.path.relpath(path, top), kind=kind, size=size))
    return FileListing(path=shown, entries=entries)


async def _stream(fd: int) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(os.read, fd, CHUNK_BYTES):
            yield chunk
    finally:
        os.close(fd)


def _open_regular(path: Path, shown: str) -> int:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise BadToolRequest(f"{shown} is not a regular file")
    return fd


def _place_file(spool: Path, target: Path, workspace: Path, owner: tuple[int, int] | None) -> None:
    if target.is_dir() and not target.is_symlink():
        raise BadToolRequest(f"cannot upload a file onto {sandbox_view(workspace, target)}: it is a folder")
    missing = [parent for parent in reversed(target.parents) if not parent.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(spool, 0o644)
    if owner is not None:  # a root-run server leaves what it places to the slot's uid
        os.chown(spool, *owner)
        for made in missing:
            os.lchown(made, *owner)
    os.replace(spool, target)  # replaces a link itself, never writes through it


def _pack(folder: Path, spool: Path, format: TransferFormat, limit: int) -> None:
    with open(spool, "wb") as out:
        pack_folder(folder, out, "w:gz" if format == "tar.gz" else "w:", limit, TransferTooLarge)


def _unpack(
    spool: Path, target: Path, format: TransferFormat, limit: int, replace: bool, owner: tuple[int, int] | None
) -> int:
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise BadToolRequest("cannot unpack a folder onto a file or a link")
    if not target.exists():
        target.mkdir(parents=True)
        if owner is not None:
            os.lchown(target, *owner)
    mode = "r:gz" if format == "tar.gz" else "r:"
    try:
        with tarfile.open(spool, mode=mode) as tar:  # type: ignore[call-overload]
            return unpack_archive(tar, target, owner, replace=replace, limit=limit)
    except tarfile.TarError as err:
        raise BadToolRequest(f"the uploaded archive cannot be unpacked: {err}") from err


