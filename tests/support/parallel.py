"""How the suite runs in parallel worker processes (pytest-xdist, `make test`; tests/README.md).

xdist runs with `--dist loadfile` (pyproject.toml): the tests of one module go to one worker, in
their order, so a module-scoped fixture starts once and two tests of a module never overlap. Each
worker is a whole pytest session of its own (its own dev server, worker and sandbox pool).

What is shared by the whole host rather than by a session, for example every process of a range
of slot uids, or a process name that a test waits to see gone, is claimed with
`@pytest.mark.host_lock("name")` on the tests (or the module) that look at it: the test holds an
`flock` on a file of that name in the host's temp dir for as long as it runs, so no other worker,
and no other test session on the machine, runs a test holding the same name meanwhile.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.tempdir import HOST_TEMP

LOCKS = "rollouts-test-locks"


def lock_folder() -> Path:
    return Path(os.environ[HOST_TEMP]) / LOCKS


@contextlib.contextmanager
def host_locks(names: list[str]) -> Iterator[None]:
    """Hold an exclusive flock on each name (in sorted order, so two tests never wait on each other)."""
    if not names:
        yield
        return
    folder = lock_folder()
    folder.mkdir(exist_ok=True)
    with contextlib.ExitStack() as held:
        for name in sorted(set(names)):
            if not re.fullmatch(r"[\w.-]+", name):
                raise ValueError(f"a host lock is named by letters, digits, '.', '-' and '_': {name!r}")
            fd = os.open(folder / name, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
            held.callback(os.close, fd)
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield


def lock_names(item: pytest.Item) -> list[str]:
    return [mark.args[0] for mark in item.iter_markers("host_lock")]


def slow_modules_first(items: list[pytest.Item]) -> None:
    """Modules with a slow test go first (in place, keeping the order within a module): xdist hands
    modules out in collection order, and the longest ones must not start last."""
    has_slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in has_slow)


def in_worker(config: pytest.Config) -> bool:
    """This process is an xdist worker (not the controller, not a run without -n)."""
    return hasattr(config, "workerinput")
