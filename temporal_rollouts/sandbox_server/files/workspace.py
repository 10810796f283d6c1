"""Workspace file access done by the server itself, on the host side of the sandbox.

A sandboxed command can plant symlinks in its workspace and swap folders for them at any
moment, so every file a tool names is opened through `beneath`: from the workspace's
descriptor, never through a link, never above it. Files are opened without blocking on
FIFOs, so a planted special file cannot hang the server either.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.sandbox_server.files.beneath import (
    ToolPath,
    chmod_at,
    folder_beneath,
    move_aside,
    open_beneath,
    open_root,
    walk,
)
from temporal_rollouts.sandbox_server.files.disk_usage import DiskUsage
from temporal_rollouts.sandbox_server.files.output import BYTES_PER_CHAR, BoundedOutput

TRASH_PREFIX = "trash-"
REMOVE_TIMEOUT_S = 600.0
PRIVILEGE_BITS = stat.S_ISUID | stat.S_ISGID


def read_text(workspace: Path, path: ToolPath, max_chars: int) -> tuple[str, bool]:
    """Read a regular file as UTF-8, keeping head and tail of a long one; raises OSError."""
    root = open_root(workspace)
    try:
        fd = open_beneath(root, path.parts, os.O_RDONLY | os.O_NONBLOCK)
    finally:
        os.close(root)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(f"is a directory: {path.shown}")
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file: {path.shown}")
        output = BoundedOutput(max_chars)
        half = max(max_chars, 1) * BYTES_PER_CHAR
        if info.st_size > 2 * half:
            output.feed(file.read(half))
            output.skip(info.st_size - 2 * half)
            file.seek(info.st_size - half)
        while chunk := file.read(half):
            output.feed(chunk)
    return output.text()


def write_text(workspace: Path, path: ToolPath, content: str, owner: tuple[int, int] | None = None) -> int:
    """Create or replace a regular file, making parent folders; returns bytes written.

    `owner` (uid, gid) is given to the file and to every folder made for it, so a root-run
    server writes files the slot's unprivileged uid can change. A file written here never keeps
    a setuid or setgid bit."""
    if not path.parts:
        raise IsADirectoryError("the workspace itself is a folder")
    data = content.encode("utf-8")
    root = open_root(workspace)
    try:
        parent = folder_beneath(root, path.parts[:-1], owner=owner)
    finally:
        os.close(root)
    try:
        flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
        fd = os.open(path.parts[-1], flags, 0o644, dir_fd=parent)
    finally:
        os.close(parent)
    with os.fdopen(fd, "wb") as file:
        info = os.fstat(file.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file: {path.shown}")
        if owner is not None:
            os.fchown(file.fileno(), *owner)
        if info.st_mode & PRIVILEGE_BITS:
            os.fchmod(file.fileno(), stat.S_IMODE(info.st_mode) & ~PRIVILEGE_BITS)
        file.truncate(0)
        file.write(data)
    return len(data)


def prepare_workspace(workspace: Path, owner: tuple[int, int] | None) -> None:
    """Make the (empty or existing) workspace directory, owned by the slot's uid, private to it."""
    try:
        os.mkdir(workspace, 0o700)
    except FileExistsError:
        if os.path.islink(workspace) or not os.path.isdir(workspace):
            raise OSError(f"{workspace} is not a directory") from None
    if owner is not None:
        os.lchown(workspace, *owner)
    os.chmod(workspace, 0o700)


def settle(workspace: Path, max_files: int = 0) -> DiskUsage:
    """After a command: take setuid and setgid bits off whatever the slot left (nothing it writes keeps
    them on the host's disk), and count the bytes and files the workspace holds. Walked by descriptor;
    `max_files` (0: no cap) stops the walk past that many entries, so its cost is bounded by the slot's
    file limit, not by what the agent made. Folders deeper than a walk goes are passed over, and said."""
    used, files, deep = 0, 0, []
    root = open_root(workspace)
    try:
        for _, parent, name, info in walk(root, too_deep=deep.append):
            used += info.st_blocks * 512
            files += 1
            if info.st_mode & PRIVILEGE_BITS and not stat.S_ISLNK(info.st_mode):
                with contextlib.suppress(OSError):  # gone or swapped meanwhile: the next settle sees it
                    chmod_at(parent, name, stat.S_IMODE(info.st_mode) & ~PRIVILEGE_BITS)
            if max_files and files > max_files:
                return DiskUsage(bytes=used, files=files, too_deep=bool(deep), cut=True)
    finally:
        os.close(root)
    return DiskUsage(bytes=used, files=files, too_deep=bool(deep))


def give_tree(workspace: Path, old_uid: int, owner: tuple[int, int]) -> None:
    """Give what `old_uid` owns in a workspace to `owner` (a slot whose uid changed), by descriptor."""
    root = open_root(workspace)
    try:
        os.chown(".", *owner, dir_fd=root, follow_symlinks=False)
        for _, parent, name, info in walk(root):
            if info.st_uid == old_uid:
                with contextlib.suppress(OSError):
                    os.chown(name, *owner, dir_fd=parent, follow_symlinks=False)
    finally:
        os.close(root)


@dataclass(frozen=True)
class Trash:
    """Where entries taken out of an agent's tree go to be deleted: a server-owned folder on the same disk."""

    folder: Path
    prefix: str = TRASH_PREFIX

    def discard(self, dir_fd: int, name: str) -> None:
        """Move the entry `name` of the folder `dir_fd` here (one rename, never through a link) and delete it."""
        aside = f"{self.prefix}{uuid.uuid4().hex}"
        trash_fd = open_root(self.folder)
        try:
            move_aside(dir_fd, name, trash_fd, aside)
        finally:
            os.close(trash_fd)
        remove_tree(self.folder / aside)


def remove_tree(top: Path) -> None:
    """Delete a tree of any depth without following links (`rm -rf`, iterative); raises OSError if it stays."""
    if not os.path.lexists(top):
        return
    argv = ["rm", "-rf", "--one-file-system", "--", str(top)]
    done = subprocess.run(argv, capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False)
    if done.returncode != 0 and os.path.lexists(top):
        # A non-root server meets folders the agent made unwritable: give them back to the owner and retry.
        subprocess.run(
            ["chmod", "-R", "u+rwx", "--", str(top)], capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False
        )
        done = subprocess.run(argv, capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False)
    if os.path.lexists(top):
        raise OSError(f"cannot remove {top}: {done.stderr.decode(errors='replace').strip()[-500:]}")
