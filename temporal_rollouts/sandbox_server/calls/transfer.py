"""Files and folders in and out of a slot, streamed: no payload is ever held whole in memory.

An upload's body is read chunk by chunk into a spool file beside the workspace (outside
it, so the slot's commands never see a half-written upload), counted against its size
limit as it arrives, and only then moved or unpacked into place. A download streams a
file straight from an open descriptor, or a folder as a tar built into a spool file
first. Memory stays at a chunk or two whatever the size; disk holds at most one spool
per transfer, bounded by the same limit.

Paths are opened through `beneath` (by descriptor, never through a link), so a transfer
can never reach outside the workspace, even while the agent swaps folders for links; unpacking refuses tar members that would (absolute paths, `..`,
links pointing out, devices), as restoring a snapshot always did. A snapshot for resume
is a download of the whole workspace as tar.gz, and its restore an upload with
`replace`: one streaming path for both. A copy between two slots of one container (a
branch of a rollout starting from its parent's files) is the same pair done in place.
On an item image the slot's whole state is its writable layer (`TransferQuery.whole`):
a snapshot, its restore and a copy move the layer, with overlay's marks of what the slot
deleted from the image, and the slot's root is mounted again over the restored layer.
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

from temporal_rollouts.sandbox_server.files.archive import pack_folder, spool_body, unpack_archive
from temporal_rollouts.sandbox_server.files.beneath import (
    ToolPath,
    describe,
    folder_beneath,
    lstat_at,
    open_beneath,
    open_root,
    walk,
)
from temporal_rollouts.sandbox_server.config import DEFAULT_MAX_PACK_S
from temporal_rollouts.sandbox_server.errors import BadToolRequest, TransferTooLarge
from temporal_rollouts.sandbox_server.calls.execution import Slot
from temporal_rollouts.sandbox_server.files.workspace import Trash
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


def spool_dir(slot: Slot, in_volume: bool = False) -> Path:
    """Beside the workspace, never inside it: the slot's commands cannot see or race a spool. In the slot's
    folder (the server's disk), so a full volume can still be packed; `in_volume` for a file upload, which is
    moved into the workspace with one rename and so counts against the slot's disk from its first byte."""
    directory = (slot.volume.path if in_volume else slot.folder) / SPOOL_DIR
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
    if query.whole and slot.root is not None:
        return await _receive_layer(slot, query, body, limit, owner)
    target = slot.tool_path("." if query.whole else query.path)
    try:
        spools = spool_dir(slot, in_volume=query.format == "file")
        fd, spool = tempfile.mkstemp(dir=spools, prefix="up-")
    except OSError as err:  # a full volume
        raise BadToolRequest(f"cannot write {target.shown}: {describe(err)}") from err
    try:
        received = await spool_body(body, fd, limit, f"the upload to {target.shown!r}")
        async with slot.lock:
            slot.disk.changed()
            if query.format == "file":
                await asyncio.to_thread(_place_file, spools, Path(spool).name, slot.workspace, target, owner)
                entries = 1
            else:
                entries = await asyncio.to_thread(
                    _unpack, Path(spool), slot.workspace, target, query.format, limit, query.replace, owner
                )
    except OSError as err:
        raise BadToolRequest(f"cannot write {target.shown}: {describe(err)}") from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spool)
    return TransferResult(path=target.shown, bytes=received, entries=entries)


async def send(
    slot: Slot, query: TransferQuery, max_bytes: int, max_pack_s: float = DEFAULT_MAX_PACK_S
) -> tuple[AsyncIterator[bytes], int, str]:
    """What a download streams: (chunks, size, kind). A file comes as its bytes, read through a descriptor
    opened now, so a later change to the workspace cannot redirect it; a folder as a tar (gzipped when
    the format says tar.gz), packed into a spool first from the folder's descriptor, within `max_pack_s`."""
    limit = min(query.max_bytes, max_bytes)
    if query.whole and slot.root is not None:  # the slot's writable layer, packed from its folder on the volume
        return await _send_folder(slot, open_root(slot.volume.tree), query.format, limit, max_pack_s, layer=True)
    target = slot.tool_path("." if query.whole else query.path)
    source = _open_in(slot.workspace, target, os.O_RDONLY | os.O_NONBLOCK)
    try:
        info = os.fstat(source)
        if stat.S_ISDIR(info.st_mode):
            folder, source = source, -1
            return await _send_folder(slot, folder, query.format, limit, max_pack_s)
        if not stat.S_ISREG(info.st_mode):
            raise BadToolRequest(f"{target.shown} is not a regular file")
        if info.st_size > limit:
            raise TransferTooLarge(f"{target.shown} is {info.st_size} bytes, over the download limit of {limit}")
        streamed, source = source, -1
        return _stream(streamed), info.st_size, "file"
    finally:
        if source >= 0:
            os.close(source)


async def _send_folder(
    slot: Slot, folder: int, format: TransferFormat, limit: int, max_pack_s: float, layer: bool = False
) -> tuple[AsyncIterator[bytes], int, str]:
    """A folder (its descriptor, closed here) as a tar, packed into a spool first under the slot's lock."""
    try:
        fd, spool = tempfile.mkstemp(dir=spool_dir(slot), prefix="down-")
        os.close(fd)
        try:
            async with slot.lock:
                await asyncio.to_thread(_pack, folder, Path(spool), format, limit, max_pack_s, layer)
            packed = os.open(spool, os.O_RDONLY | os.O_CLOEXEC)
        finally:
            os.unlink(spool)  # the open descriptor keeps the data until the stream ends
    finally:
        os.close(folder)
    return _stream(packed), os.fstat(packed).st_size, "dir"


async def _receive_layer(
    slot: Slot, query: TransferQuery, body: AsyncIterable[bytes], limit: int, owner: tuple[int, int] | None
) -> TransferResult:
    """Replace an image slot's writable layer with an archive of one (`send` with `whole`)."""
    assert slot.root is not None
    fd, spool = tempfile.mkstemp(dir=spool_dir(slot), prefix="up-")
    try:
        received = await spool_body(body, fd, limit, "the restored layer")
        async with slot.lock:
            slot.disk.changed()
            entries = await asyncio.to_thread(_unpack_layer, slot, Path(spool), query.format, limit, owner)
    except OSError as err:
        raise BadToolRequest(f"cannot restore the slot's layer: {describe(err)}") from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spool)
    return TransferResult(path="/", bytes=received, entries=entries)


def _unpack_layer(slot: Slot, spool: Path, format: TransferFormat, limit: int, owner: tuple[int, int] | None) -> int:
    assert slot.root is not None
    with slot.root.remounted():
        return _unpack(spool, slot.volume.tree, ToolPath(()), format, limit, True, owner, layer=True)


async def copy_workspace(
    source: Slot,
    target: Slot,
    max_bytes: int,
    owner: tuple[int, int] | None = None,
    max_pack_s: float = DEFAULT_MAX_PACK_S,
) -> TransferResult:
    """Replace `target`'s workspace with `source`'s: packed by descriptor into a spool under the source's
    lock, then unpacked with `replace` under the target's, exactly as a snapshot and its restore would be,
    without the trip through the worker and the object store. The locks are taken one after the other.
    Slots on an item image copy their writable layer (both run on the server's one image)."""
    layered = source.root is not None
    if layered != (target.root is not None):
        raise BadToolRequest("cannot copy between a slot on an item image and one on the server's own root")
    fd, spool = tempfile.mkstemp(dir=spool_dir(target), prefix="copy-")
    os.close(fd)
    try:
        root = open_root(source.volume.tree if layered else source.workspace)
        try:
            async with source.lock:
                await asyncio.to_thread(_pack, root, Path(spool), "tar", max_bytes, max_pack_s, layered)
        finally:
            os.close(root)
        size = os.path.getsize(spool)
        async with target.lock:
            target.disk.changed()
            if layered:
                entries = await asyncio.to_thread(_unpack_layer, target, Path(spool), "tar", max_bytes, owner)
            else:
                entries = await asyncio.to_thread(
                    _unpack, Path(spool), target.workspace, ToolPath.parse("."), "tar", max_bytes, True, owner
                )
    except OSError as err:
        raise BadToolRequest(f"cannot copy the workspace: {describe(err)}") from err
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(spool)
    return TransferResult(path=".", bytes=size, entries=entries)


def list_entries(slot: Slot, query: ListQuery) -> FileListing:
    """The files under a workspace folder (a slot's artifacts), walked by descriptor, links not followed."""
    top = slot.tool_path(query.path)
    folder = _open_in(slot.workspace, top, os.O_RDONLY | os.O_DIRECTORY)
    entries: list[FileEntry] = []
    try:
        for relative, _, _, info in walk(folder):
            if len(entries) >= query.max_entries:
                return FileListing(path=top.shown, entries=entries, truncated=True)
            kind = (
                "link"
                if stat.S_ISLNK(info.st_mode)
                else "dir"
                if stat.S_ISDIR(info.st_mode)
                else "file"
                if stat.S_ISREG(info.st_mode)
                else "other"
            )
            entries.append(FileEntry(path=relative, kind=kind, size=info.st_size if kind == "file" else 0))
    finally:
        os.close(folder)
    return FileListing(path=top.shown, entries=entries)


def _open_in(workspace: Path, path: ToolPath, flags: int) -> int:
    """Open a tool's path below the workspace, or refuse in the agent's words (no host path)."""
    root = open_root(workspace)
    try:
        return open_beneath(root, path.parts, flags)
    except FileNotFoundError:
        raise BadToolRequest(f"no such file or folder: {path.shown}") from None
    except OSError as err:
        raise BadToolRequest(f"cannot open {path.shown}: {describe(err)}") from None
    finally:
        os.close(root)


async def _stream(fd: int) -> AsyncIterator[bytes]:
    try:
        while chunk := await asyncio.to_thread(os.read, fd, CHUNK_BYTES):
            yield chunk
    finally:
        os.close(fd)


def _place_file(
    spools: Path, spool_name: str, workspace: Path, target: ToolPath, owner: tuple[int, int] | None
) -> None:
    """Move the finished spool into place: one rename between descriptors, which replaces a link itself
    and never writes through it."""
    if not target.parts:
        raise BadToolRequest("cannot upload a file onto /workspace: it is a folder")
    spool_fd = open_root(spools)
    try:
        os.chmod(spool_name, 0o644, dir_fd=spool_fd)
        if owner is not None:  # a root-run server leaves what it places to the slot's uid
            os.chown(spool_name, *owner, dir_fd=spool_fd)
        root = open_root(workspace)
        try:
            parent = folder_beneath(root, target.parts[:-1], owner=owner)
        finally:
            os.close(root)
        try:
            existing = lstat_at(parent, target.parts[-1])
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                raise BadToolRequest(f"cannot upload a file onto {target.shown}: it is a folder")
            os.replace(spool_name, target.parts[-1], src_dir_fd=spool_fd, dst_dir_fd=parent)
        finally:
            os.close(parent)
    finally:
        os.close(spool_fd)


def _pack(
    folder_fd: int, spool: Path, format: TransferFormat, limit: int, max_pack_s: float, layer: bool = False
) -> None:
    with open(spool, "wb") as out:
        mode = "w:gz" if format == "tar.gz" else "w:"
        pack_folder(folder_fd, out, mode, limit, TransferTooLarge, max_pack_s, layer)


def _unpack(
    spool: Path,
    workspace: Path,
    target: ToolPath,
    format: TransferFormat,
    limit: int,
    replace: bool,
    owner: tuple[int, int] | None,
    layer: bool = False,
) -> int:
    root = open_root(workspace)
    try:
        try:
            folder = folder_beneath(root, target.parts, owner=owner)
        except OSError as err:
            raise BadToolRequest(f"cannot unpack a folder onto {target.shown}: {describe(err)}") from None
    finally:
        os.close(root)
    mode = "r:gz" if format == "tar.gz" else "r:"
    try:
        with tarfile.open(spool, mode=mode) as tar:  # type: ignore[call-overload]
            trash = Trash(workspace.parent)
            return unpack_archive(tar, folder, owner, trash=trash, replace=replace, limit=limit, layer=layer)
    except tarfile.TarError as err:
        raise BadToolRequest(f"the uploaded archive cannot be unpacked: {err}") from err
    finally:
        os.close(folder)
