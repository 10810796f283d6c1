"""A fingerprint of the workspace, taken in the slot just before and just after a one-shot check.

A check runs the agent's programs with its own uid, in its own sandbox. The sandbox mounts the
workspace read-only for the check, and every process of the slot is stopped first, so nothing can
change it meanwhile; the two fingerprints, taken in separate commands and compared by the worker
(out of the agent's reach), are the second line: a check during which anything in the workspace
changed does not pass (a server too old to mount the workspace read-only, or a hole in that).

It fails closed. A fingerprint that cannot see everything is no fingerprint: a folder it cannot
list, a file it cannot read, an entry that vanishes while it walks, a path too long or a workspace
that is not read-only when it must be (`--read-only`) ends it with a message and exit status 3, and
the check does not pass. Otherwise an agent that made the workspace unreadable to its own uid
(`chmod 0300 /workspace`) would get the same "unreadable" fingerprint before and after, whatever
changed in between.

Content, kind, mode and link targets count, not times; links are never followed. Sent to the slot
as text and run there with `python3 -I -S - [--read-only] /workspace`, so it uses the standard
library only.
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
BLIND_EXIT = 3


class Blind(Exception):
    """Something of the workspace the fingerprint cannot see; the message says what."""


class Digest(Protocol):
    """A hash object (hashlib gives its type no public name)."""

    def update(self, data: bytes, /) -> None: ...


def fingerprint(root: str) -> dict[str, str]:
    """A digest of each top-level entry of `root` (a folder's covers its whole tree), the first
    `LISTED_ENTRIES` by name; the rest share one digest under `OTHERS`. Raises Blind."""
    names = _listing(root, ".")
    digests = {name: _entry(root, name) for name in names}
    listed = {name[:NAME_CHARS]: digests[name] for name in names[:LISTED_ENTRIES]}
    if len(names) > LISTED_ENTRIES:
        rest = hashlib.sha256()
        for name in names[LISTED_ENTRIES:]:
            rest.update(os.fsencode(name) + b"\0" + digests[name].encode())
        listed[OTHERS] = rest.hexdigest()[:32]
    return listed


def require_read_only(root: str) -> None:
    """Raise Blind unless `root` is on a read-only mount (the check's sandbox must make it so)."""
    try:
        flags = os.statvfs(root).f_flag
    except OSError as err:
        raise Blind(f"cannot stat the workspace: {err.strerror}") from None
    if not flags & os.ST_RDONLY:
        raise Blind("the workspace is writable here, and a check must see it read-only (an older sandbox server?)")


def changed(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Top-level entries that appeared, vanished or differ."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


def _entry(root: str, name: str) -> str:
    """The digest of one top-level entry and all below it: a walk in a fixed order (names sorted,
    each folder before what it holds), kept on a list rather than the stack, so depth is no limit."""
    digest = hashlib.sha256()
    pending = [name]
    while pending:
        rel = pending.pop()
        path = os.path.join(root, rel)
        try:
            info = os.lstat(path)
        except OSError as err:
            raise Blind(f"cannot see {_shown(rel)}: {err.strerror}") from None
        digest.update(os.fsencode(rel) + f"\0{stat.S_IFMT(info.st_mode)} {stat.S_IMODE(info.st_mode)}\0".encode())
        if stat.S_ISLNK(info.st_mode):
            try:
                digest.update(os.fsencode(os.readlink(path)) + b"\0")
            except OSError as err:
                raise Blind(f"cannot read the link {_shown(rel)}: {err.strerror}") from None
        elif stat.S_ISDIR(info.st_mode):
            pending.extend(os.path.join(rel, child) for child in reversed(_listing(root, rel)))
        elif stat.S_ISREG(info.st_mode):
            _feed_content(path, rel, digest)
    return digest.hexdigest()[:32]


def _listing(root: str, rel: str) -> list[str]:
    try:
        return sorted(os.listdir(os.path.join(root, rel)))
    except OSError as err:
        raise Blind(f"cannot list {_shown(rel)}: {err.strerror}") from None


def _feed_content(path: str, rel: str, digest: Digest) -> None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as err:
        raise Blind(f"cannot read {_shown(rel)}: {err.strerror}") from None
    try:
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    digest.update(b"\0")


def _shown(rel: str) -> str:
    text = "the workspace" if rel == "." else rel
    return text if len(text) <= 200 else text[:100] + "..." + text[-100:]


def main(argv: list[str]) -> int:
    read_only = "--read-only" in argv
    paths = [arg for arg in argv if arg != "--read-only"]
    root = paths[0] if paths else "."
    try:
        if read_only:
            require_read_only(root)
        prints = fingerprint(root)
    except Blind as err:
        print(f"cannot fingerprint the workspace: {err}")
        return BLIND_EXIT
    print(json.dumps(prints, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
