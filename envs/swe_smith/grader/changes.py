"""What the grader takes from the agent's repository: its edits to the library, nothing else.

The grader tests a fresh checkout of `base_commit` that it made itself, then copies onto it the
agent's changes to ordinary source files (a change is a file whose bytes differ from the base, a
base file the agent deleted, or a file the agent added inside one of the repository's packages).
Everything that steers how tests run stays as the instance has it: test files and folders,
conftest.py, pytest and packaging configuration, `sitecustomize`, `.pth` files, installed-package
metadata (`*.dist-info`, `*.egg-info`), bytecode caches, hidden files and anything outside the
packages. The agent's `.git` is never read, so its hooks and config run nothing.

Only regular files are read, and a path is followed one folder at a time without following a
symbolic link (`O_NOFOLLOW`), so a symlink, a FIFO or a device in the agent's tree is ignored
rather than read through, and a file swapped while the grader reads it is read as it was opened
or not at all. What was taken and what was ignored (with why) is reported.
"""

from __future__ import annotations

import errno
import os
import re
import stat
from dataclasses import dataclass, field

MAX_FILE_BYTES = 16 * 1024 * 1024
TEST_FOLDERS = frozenset({"test", "tests"})
TEST_FILE = re.compile(r"^(test_.*|.*_test|tests?)\.py$")
STEERING_NAMES = frozenset(
    {
        "conftest.py",
        "setup.py",
        "setup.cfg",
        "pyproject.toml",
        "tox.ini",
        "pytest.ini",
        "noxfile.py",
        "MANIFEST.in",
        "sitecustomize.py",
        "usercustomize.py",
    }
)
"""Files that configure pytest, Python's startup or the install, wherever they are."""
NOT_SOURCE_SUFFIXES = (".pth", ".pyc", ".pyo", ".so", ".pyd", ".dylib", ".dll", ".egg-link")
METADATA_SUFFIXES = (".dist-info", ".egg-info")
REGULAR_MODES = frozenset({"100644", "100755"})


@dataclass(frozen=True)
class BaseTree:
    """The tree of base_commit, from `git ls-tree -r -z`: its regular files and its packages."""

    files: frozenset[str]
    """Paths of regular files (modes 100644 and 100755); symlinks and submodules are left out."""
    packages: frozenset[str]
    """Folders holding an `__init__.py` (the repository root is never one)."""

    @classmethod
    def parse(cls, listing: bytes) -> BaseTree:
        files = set()
        for entry in listing.split(b"\0"):
            if not entry:
                continue
            meta, _, path = entry.partition(b"\t")
            mode = meta.split(b" ", 1)[0].decode()
            if mode in REGULAR_MODES:
                files.add(os.fsdecode(path))
        packages = {path.rpartition("/")[0] for path in files if path.endswith("/__init__.py")}
        return cls(frozenset(files), frozenset(packages))

    def in_a_package(self, path: str) -> bool:
        folder = path.rpartition("/")[0]
        parts = folder.split("/") if folder else []
        return any("/".join(parts[:depth]) in self.packages for depth in range(1, len(parts) + 1))


@dataclass
class Changes:
    taken: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    ignored: dict[str, str] = field(default_factory=dict)
    """Path -> why the grader left it as base_commit has it (or left it out)."""
    sources: dict[str, bytes | None] = field(default_factory=dict)
    """Each Python file taken -> its base_commit text (None: the agent added it), for `machinery`."""


def why_not_source(path: str, test_files: frozenset[str] = frozenset()) -> str | None:
    """Why a path is not an ordinary source file the agent may change, or None when it is."""
    parts = path.split("/")
    if any(part.startswith(".") for part in parts):
        return "hidden"
    if any(part == "__pycache__" or part.endswith(METADATA_SUFFIXES) for part in parts):
        return "bytecode or package metadata"
    if path in test_files or TEST_FILE.match(parts[-1]) or TEST_FOLDERS.intersection(parts[:-1]):
        return "test file"
    if parts[-1] in STEERING_NAMES or parts[-1].endswith((".ini", ".cfg", ".toml")):
        return "configuration or packaging"
    if parts[-1].endswith(NOT_SOURCE_SUFFIXES):
        return "not source"
    return None


def take_changes(agent_root: str, fresh_root: str, base: BaseTree, test_files: frozenset[str]) -> Changes:
    """Copy the agent's changes to source files from `agent_root` onto the fresh checkout `fresh_root`."""
    changes = Changes()
    try:
        agent_fd = os.open(agent_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as err:
        changes.ignored["."] = f"the repository folder cannot be read: {os.strerror(err.errno or 0)}"
        return changes
    fresh_fd = os.open(fresh_root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        for path in sorted(base.files):
            _take_base_file(agent_fd, fresh_fd, path, test_files, changes)
        for path in _added_files(agent_root, base):
            _take_added_file(agent_fd, fresh_fd, path, test_files, changes)
        for name in _added_at_the_top(agent_root, base):
            changes.ignored[name] = "outside the packages"
    finally:
        os.close(agent_fd)
        os.close(fresh_fd)
    return changes


def _take_base_file(agent_fd: int, fresh_fd: int, path: str, test_files: frozenset[str], changes: Changes) -> None:
    try:
        agent = _read(agent_fd, path)
    except FileNotFoundError:
        agent = None
    except _Refused as refused:
        changes.ignored[path] = str(refused)
        return
    try:
        base = _read(fresh_fd, path)
    except FileNotFoundError:  # left out of the checkout by the base's own export-ignore
        base = None
    if agent == base:
        return
    why = why_not_source(path, test_files)
    if why is not None:
        changes.ignored[path] = why
    elif agent is None:
        _unlink(fresh_fd, path)
        changes.deleted.append(path)
    else:
        _write(fresh_fd, path, agent, create=base is None)
        changes.taken.append(path)
        if path.endswith(".py"):
            changes.sources[path] = base


def _take_added_file(agent_fd: int, fresh_fd: int, path: str, test_files: frozenset[str], changes: Changes) -> None:
    why = why_not_source(path, test_files)
    if why is None and _exists(fresh_fd, path):
        why = "made by the grader's install"
    if why is not None:
        changes.ignored[path] = why
        return
    try:
        data = _read(agent_fd, path)
    except (FileNotFoundError, _Refused) as refused:
        changes.ignored[path] = str(refused) if isinstance(refused, _Refused) else "vanished"
        return
    try:
        _write(fresh_fd, path, data, create=True)
    except _Refused as refused:
        changes.ignored[path] = f"cannot be placed in the checkout: {refused}"
        return
    changes.taken.append(path)
    if path.endswith(".py"):
        changes.sources[path] = None


def _added_files(agent_root: str, base: BaseTree) -> list[str]:
    """Files (of any kind but folders) in the agent's tree that base_commit does not have, inside
    its packages. Only folders on the way to a package are walked, and links are never followed."""
    on_the_way = {"/".join(p.split("/")[:depth]) for p in base.packages for depth in range(1, p.count("/") + 2)}
    added = []
    for parent, folders, files in os.walk(agent_root):
        rel = os.path.relpath(parent, agent_root)
        rel = "" if rel == "." else rel.replace(os.sep, "/")
        kept = []
        for name in sorted(folders):
            sub = f"{rel}/{name}" if rel else name
            if sub in on_the_way or base.in_a_package(f"{sub}/x"):
                kept.append(name)
        folders[:] = kept
        for name in sorted(files):
            path = f"{rel}/{name}" if rel else name
            if path not in base.files and base.in_a_package(path):
                added.append(path)
    return added


def _added_at_the_top(agent_root: str, base: BaseTree) -> list[str]:
    """Names the agent added at the top of its repository (reported, never taken), `.git` aside."""
    tops = {path.split("/", 1)[0] for path in base.files}
    with os.scandir(agent_root) as entries:
        return sorted(e.name for e in entries if e.name not in tops and e.name != ".git")


class _Refused(Exception):
    """A path the grader will not read: not a regular file, behind a link, unreadable or too large."""


def _open_folder(root_fd: int, folders: list[str], create: bool = False) -> int:
    """A descriptor of root/folders..., each step opened without following a link."""
    fd = os.dup(root_fd)
    try:
        for name in folders:
            if create:
                try:
                    os.mkdir(name, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
            try:
                step = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as err:
                if err.errno == errno.ENOENT:
                    raise FileNotFoundError(name) from None
                raise _Refused(_reason(err, fd, name)) from None
            os.close(fd)
            fd = step
    except BaseException:
        os.close(fd)
        raise
    return fd


def _read(root_fd: int, path: str) -> bytes:
    *folders, name = path.split("/")
    folder = _open_folder(root_fd, folders)
    try:
        try:
            fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
        except OSError as err:
            if err.errno == errno.ENOENT:
                raise FileNotFoundError(path) from None
            raise _Refused(_reason(err)) from None
    finally:
        os.close(folder)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Refused("not a regular file")
        if info.st_size > MAX_FILE_BYTES:
            raise _Refused(f"larger than {MAX_FILE_BYTES} bytes")
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
            if sum(map(len, chunks)) > MAX_FILE_BYTES:
                raise _Refused(f"larger than {MAX_FILE_BYTES} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)


def _write(root_fd: int, path: str, data: bytes, create: bool = False) -> None:
    *folders, name = path.split("/")
    folder = _open_folder(root_fd, folders, create=create)
    try:
        fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=folder)
    except OSError as err:
        raise _Refused(_reason(err)) from None
    finally:
        os.close(folder)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _unlink(root_fd: int, path: str) -> None:
    *folders, name = path.split("/")
    try:
        folder = _open_folder(root_fd, folders)
    except FileNotFoundError:
        return
    try:
        os.unlink(name, dir_fd=folder)
    except FileNotFoundError:
        pass
    finally:
        os.close(folder)


def _exists(root_fd: int, path: str) -> bool:
    *folders, name = path.split("/")
    try:
        folder = _open_folder(root_fd, folders)
    except (FileNotFoundError, _Refused):
        return False
    try:
        os.stat(name, dir_fd=folder, follow_symlinks=False)
        return True
    except FileNotFoundError:
        return False
    finally:
        os.close(folder)


def _reason(err: OSError, folder_fd: int | None = None, name: str = "") -> str:
    if err.errno == errno.ENOTDIR and folder_fd is not None:
        try:
            if stat.S_ISLNK(os.stat(name, dir_fd=folder_fd, follow_symlinks=False).st_mode):
                return "a symbolic link"
        except OSError:
            pass
    if err.errno == errno.ELOOP:
        return "a symbolic link"
    if err.errno == errno.ENOTDIR:
        return "behind something that is not a folder"
    return os.strerror(err.errno or 0).lower()
