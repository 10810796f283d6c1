"""A slot's workspace as a gzipped tar, and back: what a failed rollout saves for its resume.

Saving and restoring keep exactly the same kinds of entry: folders, regular files and
symbolic links (kept as links, whatever they point at: an absolute link such as a
venv's `bin/python -> /usr/bin/python3` is resolved inside the sandbox, where `/` is
the sandbox's root). Other entries (FIFOs, sockets, devices) are skipped when saving
and refused when restoring, and a file with several names is saved once per name.

The host never follows a link of the workspace: saving reads links with readlink and
opens files with O_NOFOLLOW; restoring creates every entry itself (never through
tarfile's extraction), refuses names that are absolute, hold `..`, or pass through a
link, and makes files with O_EXCL|O_NOFOLLOW, so a snapshot can never write outside
the workspace. Permission bits are kept without setuid, setgid or sticky bits, and a
root-run server gives every restored entry to the slot's uid. Both walks are
iterative, so no depth of tree can make them fail.
"""

from __future__ import annotations

import io
import os
import stat
import tarfile
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import BadToolRequest, SnapshotTooLarge
from temporal_rollouts.sandbox_server.files import remove_tree

PERMISSION_BITS = 0o777
COPY_CHUNK = 1024 * 1024


def archive_workspace(workspace: Path, max_bytes: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
        for relative, info in _walk(workspace):
            _add(tar, workspace, relative, info)
            if buffer.tell() > max_bytes:
                raise SnapshotTooLarge(f"the workspace archive passed {max_bytes} bytes")
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise SnapshotTooLarge(f"the workspace archive is {len(data)} bytes, over {max_bytes}")
    return data


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


def restore_workspace(workspace: Path, data: bytes, owner: tuple[int, int] | None = None) -> int:
    """Replace the workspace's contents with the archive's; returns the number of entries."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                _check(member)
            _empty(workspace)
            for member in members:
                _restore(tar, workspace, member, owner)
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BadToolRequest(f"the workspace snapshot cannot be restored: {err}") from err
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
        raise BadToolRequest(f"snapshot entry {member.name!r} points outside the workspace")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise BadToolRequest(f"snapshot entry {member.name!r} is not a file, folder or link")
    if "\0" in member.name or (member.issym() and "\0" in member.linkname):
        raise BadToolRequest(f"snapshot entry {member.name!r} holds a NUL character")


def _restore(tar: tarfile.TarFile, workspace: Path, member: tarfile.TarInfo, owner: tuple[int, int] | None) -> None:
    parts = [part for part in Path(member.name).parts if part not in ("", ".")]
    if not parts:
        return  # the workspace itself
    parent = _parent_inside(workspace, parts[:-1], owner)
    target = os.path.join(parent, parts[-1])
    mode = member.mode & PERMISSION_BITS
    if member.isdir():
        if not os.path.isdir(target) or os.path.islink(target):
            os.mkdir(target, 0o700)
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
            raise BadToolRequest(f"snapshot entry under {part!r} would pass through a link or a file")
    return current

