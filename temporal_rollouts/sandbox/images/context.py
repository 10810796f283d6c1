"""The key of a build context: a digest of everything a build of it can see.

Every file, folder and link under the context counts, by relative path, kind, permission bits
(COPY keeps them) and content or link target; so does which Dockerfile is used and what the
base images it starts from are (their content ids: the same in every store that holds them).
Two contexts with equal keys build the same image, so a key that is in the store is never
built again, by any rollout, batch or worker of the host, and every host computes the same
key for the same task; and any
change (a file, a mode, a base with other packages) is a new key. `.dockerignore` is not applied:
an ignored file only makes the key change more often than it must, never too rarely.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from temporal_rollouts.core.errors import ImageBuildFailed

MAX_CONTEXT_BYTES = 2 * 1024**3
MAX_CONTEXT_ENTRIES = 200_000
CHUNK_BYTES = 1024 * 1024


def context_key(context: Path, dockerfile: str, base_ids: Sequence[str] = ()) -> str:
    """The hex sha256 of the context's content, the Dockerfile's path in it and the base images' content ids."""
    digest = hashlib.sha256()
    digest.update(f"dockerfile\0{dockerfile}\0".encode())
    for base_id in base_ids:
        digest.update(f"base\0{base_id}\0".encode())
    total = entries = 0
    for path, kind, mode in _walk(context):
        entries += 1
        if entries > MAX_CONTEXT_ENTRIES:
            raise ImageBuildFailed(f"build context {context} has more than {MAX_CONTEXT_ENTRIES} entries")
        relative = path.relative_to(context).as_posix()
        digest.update(f"{kind}\0{relative}\0{mode:o}\0".encode("utf-8", "surrogateescape"))
        if kind == "link":
            digest.update(os.fsencode(os.readlink(path)) + b"\0")
        elif kind == "file":
            total += _feed_file(digest, path)
            if total > MAX_CONTEXT_BYTES:
                raise ImageBuildFailed(f"build context {context} holds more than {MAX_CONTEXT_BYTES >> 30} GiB")
    return digest.hexdigest()


def _walk(root: Path):
    """(path, kind, permission bits) of every entry under `root` in a stable order, never following a link."""
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as scan:
            children = sorted(scan, key=lambda entry: entry.name)
        for entry in children:
            info = entry.stat(follow_symlinks=False)
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                yield Path(entry.path), "link", 0
            elif stat.S_ISDIR(info.st_mode):
                yield Path(entry.path), "dir", mode
            elif stat.S_ISREG(info.st_mode):
                yield Path(entry.path), "file", mode
            else:
                yield Path(entry.path), "other", mode
        stack.extend(Path(entry.path) for entry in reversed(children) if entry.is_dir(follow_symlinks=False))


def _feed_file(digest: Any, path: Path) -> int:
    """Feed the file's bytes and size to `digest` (a hashlib object); its size."""
    size = 0
    with path.open("rb") as file:
        while chunk := file.read(CHUNK_BYTES):
            size += len(chunk)
            digest.update(chunk)
    digest.update(f"\0{size}\0".encode())
    return size
