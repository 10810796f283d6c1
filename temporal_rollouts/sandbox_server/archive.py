"""Folders as tar streams, and back: what file transfer moves and a failed rollout saves for its resume.

Saving and restoring keep exactly the same kinds of entry: folders, regular files and
symbolic links (kept as links, whatever they point at: an absolute link such as a
venv's `bin/python -> /usr/bin/python3` is resolved inside the sandbox, where `/` is
the sandbox's root). Other entries (FIFOs, sockets, devices) are skipped when saving
and refused when restoring, and a file with several names is saved once per name.

The host never follows a link of the workspace: saving reads links with readlink and
opens files with O_NOFOLLOW; restoring creates every entry itself (never through
tarfile's extraction), refuses names that are absolute, hold `..`, or pass through a
link, and replaces an existing file or link instead of writing through it, so an archive
can never write outside its folder. Permission bits are kept without setuid, setgid or sticky bits, and a
root-run server gives every restored entry to the slot's uid. Both walks are
iterative, so no depth of tree can make them fail.
"""

from __future__ import annotations

import os
import stat
import tarfile
from collections.abc import AsyncIterable
from pathlib import Path
from typing import BinaryIO

from temporal_rollouts.sandbox_server.errors import BadToolRequest, TransferTooLarge
from temporal_rollouts.sandbox_server.files import remove_tree

PERMISSION_BITS = 0o777
COPY_CHUNK = 1024 * 1024


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


def pack_folder(folder: Path, out: BinaryIO, mode: str, max_bytes: int, too_large: type[Exception]) -> None:
    """Write `folder` as a tar (`mode` w: or w:gz) to `out`: files, folders and links as links, walked
    without recursion and without following a link; `too_large` once the archive passes `max_bytes`."""
    with tarfile.open(fileobj=out, mode=mode, format=tarfile.PAX_FORMAT) as tar:  # type: ignore[call-overload]
        for relative, info in _walk(folder):
            _add(tar, folder, relative, info)
            if out.tell() > max_bytes:
                raise too_large(f"the archive of the folder passed {max_bytes} bytes")


def _walk(workspace: Path) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every entry, parents before children, in sorted order; iterative."""
    found: list[tuple[str, os.stat_result]] = []
    stack = [""]
    while stack:
        relative = stack.pop()
        directory = os.path.join(workspace, relative) if relative else str(workspace)
        with os.scandir(directory) as entries:
            children = sorted(entries, key=lambda entry: entry.name, reverse=True)
        for entry in children:
            name = f"{relative}/{entry.name}" if relative else entry.name
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                found.append((name, info))
                stack.append(name)
            elif stat.S_ISREG(info.st_mode) or stat.S_ISLNK(info.st_mode):
                found.append((name, info))
    found.sort(key=lambda item: item[0].split("/"))
    return found


def _add(tar: tarfile.TarFile, workspace: Path, relative: str, info: os.stat_result) -> None:
    member = tarfile.TarInfo(relative)
    member.mode = info.st_mode & PERMISSION_BITS
    member.mtime = int(info.st_mtime)
    path = os.path.join(workspace, relative)
    if stat.S_ISDIR(info.st_mode):
        member.type = tarfile.DIRTYPE
        tar.addfile(member)
    elif stat.S_ISLNK(info.st_mode):
        member.type = tarfile.SYMTYPE
        member.linkname = os.readlink(path)
        tar.addfile(member)
    else:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            opened = os.fstat(file.fileno())
            if not stat.S_ISREG(opened.st_mode):
                return
            member.type = tarfile.REGTYPE
            member.size = opened.st_size
            tar.addfile(member, file)


def unpack_archive(
    tar: tarfile.TarFile, target: Path, owner: tuple[int, int] | None, *, replace: bool, limit: int = 0
) -> int:
    """Write the archive's files, folders and links under `target` (emptied first with `replace`):
    every entry is checked before anything is written, links are kept as links and never written
    through, and with `owner` everything made belongs to the slot's uid. `limit` bounds the bytes
    unpacked (0: none). Returns the number of entries."""
    try:
        members = tar.getmembers()
        unpacked = 0
        for member in members:
            _check(member)
            unpacked += max(member.size, 0)
            if limit and unpacked > limit:
                raise TransferTooLarge(f"the archive unpacks to more than the limit of {limit} bytes")
        if replace:
            _empty(target)
        for member in members:
            _restore(tar, target, member, owner)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BadToolRequest(f"the archive cannot be unpacked: {err}") from err
    return len(members)


def _empty(workspace: Path) -> None:
    with os.scandir(workspace) as entries:
        children = list(entries)
    for child in children:
        if child.is_dir(follow_symlinks=False):
            remove_tree(Path(child.path))
        else:
            os.unlink(child.path)


def _check(member: tarfile.TarInfo) -> None:
    name = Path(member.name)
    if not member.name or name.is_absolute() or ".." in name.parts:
        raise BadToolRequest(f"archive entry {member.name!r} points outside its folder")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise BadToolRequest(f"archive entry {member.name!r} is not a file, folder or link")
    if "\0" in member.name or (member.issym() and "\0" in member.linkname):
        raise BadToolRequest(f"archive entry {member.name!r} holds a NUL character")


def _restore(tar: tarfile.TarFile, workspace: Path, member: tarfile.TarInfo, owner: tuple[int, int] | None) -> None:
    parts = [part for part in Path(member.name).parts if part not in ("", ".")]
    if not parts:
        return  # the workspace itself
    parent = _parent_inside(workspace, parts[:-1], owner)
    target = os.path.join(parent, parts[-1])
    mode = member.mode & PERMISSION_BITS
    existing = _lstat(target)
    if existing is not None and not (member.isdir() and stat.S_ISDIR(existing.st_mode)):
        if stat.S_ISDIR(existing.st_mode):
            remove_tree(Path(target))
        else:
            os.unlink(target)  # a file or a link is replaced, never written through
    if member.isdir():
        if not os.path.isdir(target) or os.path.islink(target):
            os.mkdir(target, 0o700)  # an existing link was removed above
        os.chmod(target, mode | 0o700)
    elif member.issym():
        os.symlink(member.linkname, target)
    else:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as file:
            source = tar.extractfile(member)
            assert source is not None
            while chunk := source.read(COPY_CHUNK):
                file.write(chunk)
            os.fchmod(file.fileno(), mode)
    if owner is not None:
        os.lchown(target, *owner)


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None


def _parent_inside(workspace: Path, parts: list[str], owner: tuple[int, int] | None) -> str:
    """The host folder for these path parts, made where missing; refuses a part that is not a real folder
    (a link restored earlier, a file), so nothing is ever written through a link."""
    current = str(workspace)
    for part in parts:
        current = os.path.join(current, part)
        try:
            info = os.lstat(current)
        except FileNotFoundError:
            os.mkdir(current, 0o755)
            if owner is not None:
                os.lchown(current, *owner)
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise BadToolRequest(f"archive entry under {part!r} would pass through a link or a file")
    return current

