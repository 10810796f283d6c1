"""A slot's workspace as a gzipped tar, and back: what a failed rollout saves for its resume.

Restoring refuses members that would land outside the workspace (absolute paths, `..`,
links pointing out, devices), so a snapshot can never write to the host.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import BadToolRequest, SnapshotTooLarge


def archive_workspace(workspace: Path, max_bytes: int) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in sorted(workspace.rglob("*")):
            tar.add(path, arcname=str(path.relative_to(workspace)), recursive=False)
            if buffer.tell() > max_bytes:
                raise SnapshotTooLarge(f"the workspace archive passed {max_bytes} bytes")
    data = buffer.getvalue()
    if len(data) > max_bytes:
        raise SnapshotTooLarge(f"the workspace archive is {len(data)} bytes, over {max_bytes}")
    return data


def restore_workspace(workspace: Path, data: bytes) -> int:
    """Replace the workspace's contents with the archive's; returns the number of entries."""
    for child in workspace.iterdir():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    try:
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            members = tar.getmembers()
            for member in members:
                _check(member)
            tar.extractall(workspace, members=members, filter="data")
    except (tarfile.TarError, EOFError, OSError) as err:
        raise BadToolRequest(f"the workspace snapshot cannot be restored: {err}") from err
    return len(members)


def _check(member: tarfile.TarInfo) -> None:
    name = Path(member.name)
    if name.is_absolute() or ".." in name.parts:
        raise BadToolRequest(f"snapshot entry {member.name!r} points outside the workspace")
    if not (member.isfile() or member.isdir() or member.issym()):
        raise BadToolRequest(f"snapshot entry {member.name!r} is not a file, folder or link")
