"""Workspace file access done by the server itself, on the host side of the sandbox.

A sandboxed command can plant symlinks in its workspace, so every path a tool
names is resolved on the host and refused unless it stays inside the workspace.
Files are opened without following a final symlink and without blocking on
FIFOs, so a planted special file cannot hang or redirect the server.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import BadToolRequest
from temporal_rollouts.sandbox_server.isolation import WORKSPACE_MOUNT
from temporal_rollouts.sandbox_server.output import BYTES_PER_CHAR, BoundedOutput


def resolve_in_workspace(workspace: Path, path: str) -> Path:
    """Map a tool's path (relative, or absolute under /workspace) to a host path inside `workspace`."""
    if "\0" in path:
        raise BadToolRequest("path contains a NUL character")
    if path == WORKSPACE_MOUNT or path.startswith(WORKSPACE_MOUNT + "/"):
        relative = path[len(WORKSPACE_MOUNT) :].lstrip("/")
    elif os.path.isabs(path):
        raise BadToolRequest(f"path {path!r} is outside the workspace; use a path under {WORKSPACE_MOUNT}")
    else:
        relative = path
    root = os.path.realpath(workspace)
    resolved = os.path.realpath(os.path.join(root, relative))
    if resolved != root and not resolved.startswith(root + os.sep):
        raise BadToolRequest(f"path {path!r} leads outside the workspace")
    return Path(resolved)


def sandbox_view(workspace: Path, resolved: Path) -> str:
    """How the command inside the sandbox sees a resolved host path."""
    relative = os.path.relpath(resolved, os.path.realpath(workspace))
    return WORKSPACE_MOUNT if relative == "." else f"{WORKSPACE_MOUNT}/{relative}"


def relative_to_workspace(workspace: Path, resolved: Path) -> str:
    return os.path.relpath(resolved, os.path.realpath(workspace))


def read_text(path: Path, max_chars: int) -> tuple[str, bool]:
    """Read a regular file as UTF-8, keeping head and tail of a long one; raises OSError."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(file.fileno())
        if stat.S_ISDIR(info.st_mode):
            raise IsADirectoryError(f"is a directory: {path.name}")
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"not a regular file: {path.name}")
        output = BoundedOutput(max_chars)
        half = max(max_chars, 1) * BYTES_PER_CHAR
        if info.st_size > 2 * half:
            output.feed(file.read(half))
            output.skip(info.st_size - 2 * half)
            file.seek(info.st_size - half)
        while chunk := file.read(half):
            output.feed(chunk)
    return output.text()


def write_text(path: Path, content: str) -> int:
    """Create or replace a regular file, making parent directories; returns bytes written."""
    path.parent.mkdir(parents=True, exist_ok=True)
    data = content.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    with os.fdopen(fd, "wb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(f"not a regular file: {path.name}")
        file.truncate(0)
        file.write(data)
    return len(data)


def clear_directory(directory: Path) -> None:
    """Remove everything inside `directory` (dotfiles included), keeping the directory."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            try:
                shutil.rmtree(entry.path)
            except PermissionError:
                _make_tree_writable(entry.path)
                shutil.rmtree(entry.path)
        else:
            os.unlink(entry.path)


def _make_tree_writable(top: str) -> None:
    os.chmod(top, 0o700)
    for parent, subdirectories, _ in os.walk(top):
        for name in subdirectories:
            subdirectory = os.path.join(parent, name)
            if not os.path.islink(subdirectory):
                os.chmod(subdirectory, 0o700)
