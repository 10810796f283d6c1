"""Folders as tar streams, and back: what file transfer moves and a failed rollout saves for its resume.

Saving and restoring keep exactly the same kinds of entry: folders, regular files and
symbolic links (kept as links, whatever they point at: an absolute link such as a
venv's `bin/python -> /usr/bin/python3` is resolved inside the sandbox, where `/` is
the sandbox's root). Other entries (FIFOs, sockets, devices) are skipped when saving
and refused when restoring, and a file with several names is saved once per name.

A slot on an item image saves its writable layer instead (`layer`): besides files, folders and
links, overlay's marks of what the slot deleted from the image come along: a whiteout (a character
device 0:0, the only device ever saved or restored) and an opaque folder (its
`trusted.overlay.opaque` attribute, in the archive as a PAX header).

The host never follows a link of the workspace, even one swapped in while it works: both
directions go by descriptor (`beneath`). Saving walks folders opened with O_NOFOLLOW from
their parent's descriptor and reads links with readlinkat; restoring creates every entry
itself (never through tarfile's extraction), refuses names that are absolute, hold `..`, or
pass through a link, and replaces an existing file or link instead of writing through it,
so an archive can never write outside its folder. Permission bits are kept without setuid,
setgid or sticky bits, and a root-run server gives every restored entry to the slot's uid.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tarfile
import time
from collections.abc import AsyncIterable, Callable
from pathlib import Path
from typing import BinaryIO

from temporal_rollouts.sandbox_server.files import sparse
from temporal_rollouts.sandbox_server.files.beneath import (
    MAX_DEPTH,
    chmod_at,
    describe,
    folder_beneath,
    list_names,
    lstat_at,
    walk,
)
from temporal_rollouts.sandbox_server.errors import BadToolRequest, TransferTooLarge
from temporal_rollouts.sandbox_server.files.workspace import Trash

PERMISSION_BITS = 0o777
OPAQUE_XATTR = "trusted.overlay.opaque"
OPAQUE_HEADER = f"SCHILY.xattr.{OPAQUE_XATTR}"
COPY_CHUNK = 1024 * 1024
GZIP_LEVEL = 6
"""zlib's own default: level 9 (tarfile's) took four times the CPU for an archive 1 % smaller (54 MB of source here)."""


async def spool_body(body: AsyncIterable[bytes], fd: int, limit: int, what: str) -> int:
    """Write a request body to the open file `fd` (closed after), refusing it once it passes `limit`
    bytes (TransferTooLarge naming `what`); the bytes received."""
    received = 0
    with os.fdopen(fd, "wb") as out:
        async for chunk in body:
            received += len(chunk)
            if received > limit:
                raise TransferTooLarge(f"{what} passed its limit of {limit} bytes")
            out.write(chunk)
    return received


def pack_folder(
    dir_fd: int,
    out: BinaryIO,
    mode: str,
    max_bytes: int,
    too_large: type[Exception],
    max_seconds: float | None = None,
    layer: bool = False,
) -> None:
    """Write the folder `dir_fd` as a tar (`mode` w: or w:gz) to `out`: files, folders and links as links,
    files with holes as sparse members (`sparse`), walked by descriptor without recursion and without
    following a link. `too_large` once the archive passes `max_bytes`, or packing passes `max_seconds`
    (its CPU too, as one thread packs), or the tree is deeper than a walk goes: what the server spends on
    a pack is bounded by these, whatever the agent made. Entries that change while they are packed (a
    link swapped for a folder, a file removed) are saved as they were seen, or not at all."""
    deadline = None if max_seconds is None else time.monotonic() + max_seconds

    def tick() -> None:
        if deadline is not None and time.monotonic() > deadline:
            raise too_large(f"packing the folder took longer than its limit of {max_seconds:g} s")

    def too_deep(path: str) -> None:
        raise too_large(f"the folder holds a tree deeper than {MAX_DEPTH} levels, which is not saved")

    options = {"compresslevel": GZIP_LEVEL} if mode == "w:gz" else {}
    with tarfile.open(fileobj=out, mode=mode, format=tarfile.PAX_FORMAT, **options) as tar:  # type: ignore[call-overload]
        for relative, parent_fd, name, info in walk(dir_fd, too_deep=too_deep):
            tick()
            _add(tar, relative, parent_fd, name, info, tick, layer)
            if out.tell() > max_bytes:
                raise too_large(f"the archive of the folder passed {max_bytes} bytes")


def _add(
    tar: tarfile.TarFile,
    relative: str,
    parent_fd: int,
    name: str,
    info: os.stat_result,
    tick: Callable[[], None],
    layer: bool = False,
) -> None:
    member = tarfile.TarInfo(relative)
    member.mode = info.st_mode & PERMISSION_BITS
    member.mtime = int(info.st_mtime)
    if stat.S_ISDIR(info.st_mode):
        member.type = tarfile.DIRTYPE
        if layer and _opaque(parent_fd, name):
            member.pax_headers = {OPAQUE_HEADER: "y"}
        tar.addfile(member)
    elif layer and _whiteout(info):
        member.type, member.devmajor, member.devminor, member.mode = tarfile.CHRTYPE, 0, 0, 0
        tar.addfile(member)
    elif stat.S_ISLNK(info.st_mode):
        try:
            member.linkname = os.readlink(name, dir_fd=parent_fd)
        except OSError:  # swapped for a folder or a file, or removed, since it was listed: not saved
            return
        member.type = tarfile.SYMTYPE
        tar.addfile(member)
    elif stat.S_ISREG(info.st_mode):
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=parent_fd)
        except OSError:  # swapped for a link or removed since it was listed: not saved
            return
        with os.fdopen(fd, "rb") as file:
            opened = os.fstat(file.fileno())
            if not stat.S_ISREG(opened.st_mode):
                return
            member.type = tarfile.REGTYPE
            if (segments := sparse.data_segments(file.fileno(), opened)) is not None:
                head = sparse.sparse_member(member, opened.st_size, segments)
                tar.addfile(member, sparse.SegmentReader(head, file, segments, tick))
            else:
                member.size = opened.st_size
                tar.addfile(member, _Exactly(file, opened.st_size, tick))


def _whiteout(info: os.stat_result) -> bool:
    """overlay's mark of a file the slot deleted from the image: a character device 0:0."""
    return stat.S_ISCHR(info.st_mode) and info.st_rdev == 0


def _opaque(parent_fd: int, name: str) -> bool:
    """Whether a layer's folder hides the image's folder below it (overlay's opaque mark)."""
    try:
        return os.getxattr(f"/proc/self/fd/{parent_fd}/{name}", OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


class _Exactly:
    """A file read as exactly `size` bytes (zeros after an end that came early), so a file the agent
    truncates or grows while it is packed cannot break the archive."""

    def __init__(self, file: BinaryIO, size: int, tick: Callable[[], None]) -> None:
        self._file, self._left, self._tick = file, size, tick

    def read(self, count: int = -1) -> bytes:
        self._tick()
        count = self._left if count < 0 else min(count, self._left)
        data = self._file.read(count) if count else b""
        data += b"\0" * (count - len(data))
        self._left -= count
        return data


def unpack_archive(
    tar: tarfile.TarFile,
    target_fd: int,
    owner: tuple[int, int] | None,
    *,
    trash: Trash,
    replace: bool,
    limit: int = 0,
    layer: bool = False,
) -> int:
    """Write the archive's files, folders and links under the folder `target_fd` (emptied first with
    `replace`): every entry is checked before anything is written, links are kept as links and never
    written through, entries are made by descriptor below `target_fd` only, and with `owner` everything
    made belongs to the slot's uid. Entries moved out of the way go to `trash`. `limit` bounds the bytes
    unpacked (0: none). `layer`: an image slot's writable layer, whose whiteouts and opaque folders are
    made too. Returns the number of entries."""
    try:
        members = tar.getmembers()
        unpacked = 0
        for member in members:
            _check(member, layer)
            unpacked += sparse.stored_bytes(member)
            if limit and unpacked > limit:
                raise TransferTooLarge(f"the archive unpacks to more than the limit of {limit} bytes")
        if replace:
            for name in list_names(target_fd):
                _remove(target_fd, name, trash)
        for member in members:
            _restore(tar, target_fd, member, owner, trash, layer)
    except BadToolRequest:
        raise
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BadToolRequest(
            f"the archive cannot be unpacked: {describe(err) if isinstance(err, OSError) else err}"
        ) from err
    return len(members)


def _check(member: tarfile.TarInfo, layer: bool = False) -> None:
    name = Path(member.name)
    if not member.name or name.is_absolute() or ".." in name.parts:
        raise BadToolRequest(f"archive entry {member.name!r} points outside its folder")
    if layer and member.ischr() and member.devmajor == member.devminor == 0:
        return  # a whiteout: the one device a layer holds
    if not (member.isfile() or member.isdir() or member.issym()):
        raise BadToolRequest(f"archive entry {member.name!r} is not a file, folder or link")
    if "\0" in member.name or (member.issym() and "\0" in member.linkname):
        raise BadToolRequest(f"archive entry {member.name!r} holds a NUL character")
    if member.issparse() and (broken := sparse.check_map(member)):
        raise BadToolRequest(broken)


def _remove(dir_fd: int, name: str, trash: Trash) -> None:
    info = lstat_at(dir_fd, name)
    if info is None:
        return
    if stat.S_ISDIR(info.st_mode):
        trash.discard(dir_fd, name)
    else:
        os.unlink(name, dir_fd=dir_fd)  # a file or a link is removed, never written through


def _restore(
    tar: tarfile.TarFile,
    target_fd: int,
    member: tarfile.TarInfo,
    owner: tuple[int, int] | None,
    trash: Trash,
    layer: bool = False,
) -> None:
    parts = [part for part in Path(member.name).parts if part not in ("", ".")]
    if not parts:
        return  # the folder itself
    try:
        parent = folder_beneath(target_fd, parts[:-1], owner=owner)
    except OSError as err:
        raise BadToolRequest(f"archive entry {member.name!r} would pass through a link or a file") from err
    try:
        _make(tar, parent, parts[-1], member, owner, trash)
        if layer and member.isdir() and member.pax_headers.get(OPAQUE_HEADER) == "y":
            os.setxattr(f"/proc/self/fd/{parent}/{parts[-1]}", OPAQUE_XATTR, b"y", follow_symlinks=False)
    finally:
        os.close(parent)


def _make(
    tar: tarfile.TarFile, parent: int, name: str, member: tarfile.TarInfo, owner: tuple[int, int] | None, trash: Trash
) -> None:
    mode = member.mode & PERMISSION_BITS
    existing = lstat_at(parent, name)
    if existing is not None and not (member.isdir() and stat.S_ISDIR(existing.st_mode)):
        _remove(parent, name, trash)
    if member.isdir():
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o700, dir_fd=parent)
        chmod_at(parent, name, mode | 0o700)
    elif member.issym():
        os.symlink(member.linkname, name, dir_fd=parent)
    elif member.ischr():  # a whiteout (`_check` lets no other device through)
        os.mknod(name, stat.S_IFCHR, os.makedev(0, 0), dir_fd=parent)
    else:
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        with os.fdopen(os.open(name, flags, 0o600, dir_fd=parent), "wb") as file:
            source = tar.extractfile(member)
            assert source is not None
            if member.issparse():
                sparse.restore(source, file, member)
            else:
                while chunk := source.read(COPY_CHUNK):
                    file.write(chunk)
            os.fchmod(file.fileno(), mode)
    if owner is not None:
        os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
