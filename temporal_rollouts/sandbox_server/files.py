"""Workspace file access done by the server itself, on the host side of the sandbox.

A sandboxed command can plant symlinks in its workspace, so every path a tool
names is resolved on the host and refused unless it stays inside the workspace.
Files are opened without following a final symlink and without blocking on
FIFOs, so a planted special file cannot hang or redirect the server.
"""

from __future__ import annotations

import os
import stat
import subprocess
import uuid
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import BadToolRequest
from temporal_rollouts.sandbox_server.isolation import WORKSPACE_MOUNT
from temporal_rollouts.sandbox_server.output import BYTES_PER_CHAR, BoundedOutput

TRASH_PREFIX = "trash-"
REMOVE_TIMEOUT_S = 600.0


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


def write_text(path: Path, content: str, owner: tuple[int, int] | None = None) -> int:
    """Create or replace a regular file, making parent directories; returns bytes written.

    `owner` (uid, gid) is given to the file and to every directory made for it, so a root-run
    server writes files the slot's unprivileged uid can change."""
    _make_parents(path.parent, owner)
    data = content.encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    with os.fdopen(fd, "wb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise OSError(f"not a regular file: {path.name}")
        if owner is not None:
            os.fchown(file.fileno(), *owner)
        file.truncate(0)
        file.write(data)
    return len(data)


def _make_parents(directory: Path, owner: tuple[int, int] | None) -> None:
    missing = []
    while not os.path.lexists(directory):
        missing.append(directory)
        directory = directory.parent
    for made in reversed(missing):
        os.mkdir(made, 0o755)
        if owner is not None:
            os.lchown(made, *owner)


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


def reset_workspace(workspace: Path, owner: tuple[int, int] | None) -> Path | None:
    """Empty the workspace in constant time: move it aside to a trash folder beside it and make a
    fresh one. Returns the trash folder, for `remove_tree` to delete later (None if nothing moved).

    Never walks the agent's tree, so no depth or size of tree can make it fail or take long."""
    trash = None
    if os.path.lexists(workspace):
        trash = workspace.with_name(f"{TRASH_PREFIX}{uuid.uuid4().hex}")
        os.rename(workspace, trash)
    prepare_workspace(workspace, owner)
    with os.scandir(workspace) as entries:
        if next(entries, None) is not None:
            raise OSError(f"{workspace} is not empty after its reset")
    return trash


def leftover_trash(parent: Path) -> list[Path]:
    return [Path(entry.path) for entry in os.scandir(parent) if entry.name.startswith(TRASH_PREFIX)]


def remove_tree(top: Path) -> None:
    """Delete a tree of any depth without following links (`rm -rf`, iterative); raises OSError if it stays."""
    if not os.path.lexists(top):
        return
    argv = ["rm", "-rf", "--one-file-system", "--", str(top)]
    done = subprocess.run(argv, capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False)
    if done.returncode != 0 and os.path.lexists(top):
        # A non-root server meets folders the agent made unwritable: give them back to the owner and retry.
        subprocess.run(["chmod", "-R", "u+rwx", "--", str(top)], capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False)
        done = subprocess.run(argv, capture_output=True, timeout=REMOVE_TIMEOUT_S, check=False)
    if os.path.lexists(top):
        raise OSError(f"cannot remove {top}: {done.stderr.decode(errors='replace').strip()[-500:]}")


def clear_directory(directory: Path) -> None:
    """Remove everything inside `directory` (dotfiles included), keeping the directory; any depth."""
    directory.mkdir(parents=True, exist_ok=True)
    for entry in os.scandir(directory):
        if entry.is_dir(follow_symlinks=False):
            remove_tree(Path(entry.path))
        else:
            os.unlink(entry.path)
