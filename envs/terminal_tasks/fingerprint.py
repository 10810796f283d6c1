"""A fingerprint of the workspace, taken in the slot just before and just after a one-shot check.

A check runs the agent's programs with its own uid, in its own sandbox, so such a program can
rewrite the files the check reads after it (a `main.py` that prints the right product, then puts
its original text back for the check that it was not edited). Checks observe the workspace; they
do not change it. So the env fingerprints it in separate commands before and after the check, the
digests travel through the worker (out of the agent's reach), and a check during which anything
in the workspace changed does not pass.

Content, kind, mode and link targets count, not times; links are never followed. Sent to the slot
as text and run there with `python3 -I -S - /workspace`, so it uses the standard library only.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import sys
from typing import Protocol

LISTED_ENTRIES = 100
NAME_CHARS = 100
OTHERS = "(other entries)"


class Digest(Protocol):
    """A hash object (hashlib gives its type no public name)."""

    def update(self, data: bytes, /) -> None: ...


def fingerprint(root: str) -> dict[str, str]:
    """A digest of each top-level entry of `root` (a folder's covers its whole tree), the first
    `LISTED_ENTRIES` by name; the rest share one digest under `OTHERS`."""
    try:
        names = sorted(os.listdir(root))
    except OSError as err:
        return {OTHERS: f"unreadable: {err.strerror}"}
    digests = {name: _entry(os.path.join(root, name)) for name in names}
    listed = {name[:NAME_CHARS]: digests[name] for name in names[:LISTED_ENTRIES]}
    if len(names) > LISTED_ENTRIES:
        rest = hashlib.sha256()
        for name in names[LISTED_ENTRIES:]:
            rest.update(os.fsencode(name) + b"\0" + digests[name].encode())
        listed[OTHERS] = rest.hexdigest()[:32]
    return listed


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Top-level entries that appeared, vanished or differ."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def _entry(path: str) -> str:
    digest = hashlib.sha256()
    _feed(path, "", digest)
    return digest.hexdigest()[:32]


def _feed(path: str, rel: str, digest: Digest) -> None:
    try:
        info = os.lstat(path)
    except OSError as err:
        digest.update(f"{rel}\0gone {err.errno}\0".encode())
        return
    digest.update(os.fsencode(rel) + f"\0{stat.S_IFMT(info.st_mode)} {stat.S_IMODE(info.st_mode)}\0".encode())
    if stat.S_ISLNK(info.st_mode):
        digest.update(os.fsencode(os.readlink(path)) + b"\0")
    elif stat.S_ISDIR(info.st_mode):
        try:
            names = sorted(os.listdir(path))
        except OSError as err:
            digest.update(f"unlistable {err.errno}\0".encode())
            return
        for name in names:
            _feed(os.path.join(path, name), f"{rel}/{name}", digest)
    elif stat.S_ISREG(info.st_mode):
        _feed_content(path, digest)


def _feed_content(path: str, digest: Digest) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        digest.update(f"unreadable {err.errno}\0".encode())
        return
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    digest.update(b"\0")


if __name__ == "__main__":
    print(json.dumps(fingerprint(sys.argv[1] if len(sys.argv) > 1 else "."), sort_keys=True))
