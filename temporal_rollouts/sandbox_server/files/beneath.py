"""Paths of an agent's workspace opened so that the server can never be led out of it.

The server runs as root and works on trees an agent changes while it works: a folder it
checked can be swapped for a symbolic link to a host folder (`rename` with
RENAME_EXCHANGE) before it is opened. So nothing here resolves a path and then opens it by
name. Every path is opened from a descriptor of a folder known to be inside, and the kernel
refuses any symbolic link on the way and any step above that folder:

- `openat2` with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS | RESOLVE_NO_XDEV
  where the kernel has it (Linux 5.6+, not blocked by a seccomp profile);
- otherwise a walk one component at a time, each opened with O_NOFOLLOW relative to the
  descriptor of the one before.

A tool's path is taken apart lexically first (`ToolPath`): `..` can only cancel a name
before it, never climb above the workspace. Symbolic links inside a workspace stay usable
from the slot's own commands (the sandbox resolves them in its own view); the server's file
tools refuse to pass through one.

Walks (`walk`) hold one descriptor per level of depth and go at most `MAX_DEPTH` deep.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import os
import stat
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import BadToolRequest

WORKSPACE_MOUNT = "/workspace"
MAX_DEPTH = 2048
"""Folders deeper than this are refused by walks (each level holds one descriptor)."""

_SYS_OPENAT2 = 437  # the same number on every architecture (added after the syscall tables were unified)
_RESOLVE_NO_XDEV, _RESOLVE_NO_MAGICLINKS, _RESOLVE_NO_SYMLINKS, _RESOLVE_BENEATH = 0x01, 0x02, 0x04, 0x08
_RACE_RETRIES = 64
_RESOLVE = _RESOLVE_NO_XDEV | _RESOLVE_NO_MAGICLINKS | _RESOLVE_NO_SYMLINKS | _RESOLVE_BENEATH
_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
READ_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
"""A folder opened to list it (scandir needs a readable descriptor)."""


class _OpenHow(ctypes.Structure):
    _fields_ = [("flags", ctypes.c_uint64), ("mode", ctypes.c_uint64), ("resolve", ctypes.c_uint64)]


@dataclass(frozen=True)
class ToolPath:
    """A path a tool named, as components under the slot's root folder; `shown` is how the slot sees it.

    The root folder is the workspace, mounted at /workspace (`mount`), and a relative path starts there.
    On an item image the root folder is the slot's whole root, `/` (`image_root`), and a relative path
    starts at the image's WORKDIR (`cwd`)."""

    parts: tuple[str, ...]
    mount: str = WORKSPACE_MOUNT

    @classmethod
    def parse(cls, path: str, mount: str = WORKSPACE_MOUNT, cwd: tuple[str, ...] = ()) -> ToolPath:
        if "\0" in path:
            raise BadToolRequest("path contains a NUL character")
        inside = mount.rstrip("/")
        if mount == "/" and path.startswith("/"):
            relative, start = path, []
        elif path == inside or path.startswith(inside + "/"):
            relative, start = path[len(inside) :], []
        elif path.startswith("/"):
            raise BadToolRequest(f"path {path!r} is outside the workspace; use a path under {mount}")
        else:
            relative, start = path, list(cwd)
        parts: list[str] = start
        for part in relative.split("/"):
            if part == "..":
                if not parts:
                    raise BadToolRequest(f"path {path!r} leads outside the {'root' if mount == '/' else 'workspace'}")
                parts.pop()
            elif part not in ("", "."):
                parts.append(part)
        return cls(tuple(parts), mount)

    @property
    def shown(self) -> str:
        inside = self.mount.rstrip("/")
        return "/".join((inside, *self.parts)) if self.parts else self.mount

    @property
    def relative(self) -> str:
        return "/".join(self.parts) or "."


def open_root(folder: Path) -> int:
    """A descriptor of a folder the server made (a workspace, a staging folder), never through a link."""
    return os.open(folder, _DIR)


def open_beneath(dir_fd: int, parts: tuple[str, ...] | list[str], flags: int, mode: int = 0) -> int:
    """Open `parts` below the folder `dir_fd` without following any link or leaving the folder.
    Raises OSError: ELOOP where a link stands on the way (or at its end), ENOTDIR where a file does,
    ENOENT where something is missing."""
    flags |= os.O_NOFOLLOW | os.O_CLOEXEC
    if not parts:
        return os.open(".", flags, mode, dir_fd=dir_fd)
    if _openat2_works():
        return _openat2(dir_fd, "/".join(parts), flags, mode if flags & os.O_CREAT else 0)
    parent = _walk_to(dir_fd, parts[:-1])
    try:
        return os.open(parts[-1], flags, mode, dir_fd=parent)
    finally:
        if parent != dir_fd:
            os.close(parent)


def folder_beneath(
    dir_fd: int, parts: tuple[str, ...] | list[str], *, owner: tuple[int, int] | None = None, create: bool = True
) -> int:
    """An O_PATH descriptor of the folder `parts` below `dir_fd`, making missing folders (mode 0755,
    given to `owner`) one at a time; a link (ELOOP) or a file (ENOTDIR) on the way is refused."""
    current = os.dup(dir_fd)
    try:
        for part in parts:
            try:
                child = _open_folder(current, part)
            except FileNotFoundError:
                if not create:
                    raise
                with contextlib.suppress(FileExistsError):  # made meanwhile: opened (and checked) below
                    os.mkdir(part, 0o755, dir_fd=current)
                    if owner is not None:
                        os.chown(part, *owner, dir_fd=current, follow_symlinks=False)
                child = _open_folder(current, part)
            os.close(current)
            current = child
    except BaseException:
        os.close(current)
        raise
    return current


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def list_names(dir_fd: int) -> list[str]:
    """The names in the folder `dir_fd`."""
    fd = os.open(".", READ_DIR, dir_fd=dir_fd)
    try:
        with os.scandir(fd) as entries:  # scandir reads a copy of the descriptor
            return [entry.name for entry in entries]
    finally:
        os.close(fd)


def chmod_at(dir_fd: int, name: str, mode: int) -> None:
    """Change the mode of a file or folder (never of a link, never through one)."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def move_aside(dir_fd: int, name: str, trash_fd: int, trash_name: str) -> None:
    """Take an entry out of a folder in constant time (into a server-owned trash folder on the same disk)."""
    os.rename(name, trash_name, src_dir_fd=dir_fd, dst_dir_fd=trash_fd)


def walk(
    dir_fd: int, *, max_depth: int = MAX_DEPTH, too_deep: Callable[[str], None] | None = None
) -> Iterator[tuple[str, int, str, os.stat_result]]:
    """Every entry below the folder `dir_fd` as (relative path, descriptor of its folder, name, lstat),
    folders before what they hold, names sorted; never through a link. A folder that vanishes or
    cannot be opened meanwhile is passed over. A folder deeper than `max_depth` is passed over too,
    after `too_deep(its path)`; without `too_deep` it raises BadToolRequest."""
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = []

    def enter(fd: int, relative: str) -> None:
        if len(stack) >= max_depth:
            os.close(fd)
            if too_deep is None:
                raise BadToolRequest(f"the folder tree is deeper than {max_depth} levels")
            too_deep(relative)
            return
        with os.scandir(fd) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
        stack.append((fd, relative, iter(entries)))

    enter(os.open(".", READ_DIR, dir_fd=dir_fd), "")
    try:
        while stack:
            fd, relative, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                os.close(fd)
                stack.pop()
                continue
            try:
                info = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue
            path = f"{relative}/{entry.name}" if relative else entry.name
            yield path, fd, entry.name, info
            if stat.S_ISDIR(info.st_mode):
                try:
                    child = os.open(entry.name, READ_DIR, dir_fd=fd)
                except OSError:  # gone, swapped for a link, or unreadable: not followed
                    continue
                enter(child, path)
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def describe(err: OSError) -> str:
    """An OSError for an agent: what went wrong, never the host path it happened at."""
    if err.errno == errno.ELOOP:
        return "the path passes through a symbolic link (file tools do not follow links; the terminal does)"
    if err.errno == errno.EXDEV:
        return "the path leads outside the workspace"
    return err.strerror or type(err).__name__


def _open_folder(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, _DIR, dir_fd=dir_fd)
    except NotADirectoryError:
        info = lstat_at(dir_fd, name)  # only to say why, as openat2 would: the refusal already happened
        if info is not None and stat.S_ISLNK(info.st_mode):
            raise OSError(errno.ELOOP, os.strerror(errno.ELOOP)) from None
        raise


def refused(err: OSError) -> bool:
    """Whether an open failed because the path passes through a link or leaves the folder (a request
    to refuse), rather than because of what is there (a missing file: the agent's to see)."""
    return err.errno in (errno.ELOOP, errno.EXDEV)


def _walk_to(dir_fd: int, parts: tuple[str, ...] | list[str]) -> int:
    if not parts:
        return dir_fd
    return folder_beneath(dir_fd, parts, create=False)


def _openat2(dir_fd: int, path: str, flags: int, mode: int) -> int:
    how = _OpenHow(flags, mode, _RESOLVE)
    for _ in range(_RACE_RETRIES):
        fd = _libc().syscall(
            _SYS_OPENAT2,
            ctypes.c_int(dir_fd),
            ctypes.c_char_p(os.fsencode(path)),
            ctypes.byref(how),
            ctypes.c_size_t(ctypes.sizeof(how)),
        )
        if fd >= 0:
            return fd
        code = ctypes.get_errno()
        if code != errno.EAGAIN:  # EAGAIN: a rename somewhere raced the lookup; the kernel asks us to retry
            break
    raise OSError(code, os.strerror(code))


@functools.cache
def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _openat2_works() -> bool:
    """Whether this kernel (and any seccomp profile around us) lets openat2 through; probed once."""
    global USE_OPENAT2
    if USE_OPENAT2 is None:
        try:
            root = os.open("/", _DIR)
            try:
                os.close(_openat2(root, ".", os.O_PATH | os.O_CLOEXEC, 0))
                USE_OPENAT2 = True
            finally:
                os.close(root)
        except (OSError, AttributeError):
            USE_OPENAT2 = False
    return USE_OPENAT2


USE_OPENAT2: bool | None = None
"""None until probed; tests set False to run the component walk where the kernel has openat2."""
