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

TESTS = Path(__file__).resolve().parents[1]

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


LONGEST_FIRST = (
    "integration/test_atropos_env.py",
    "integration/test_swe_smith.py",
    "integration/test_training_feed.py",
    "integration/test_harbor.py",
    "e2e/test_train_with_atropos.py",
    "e2e/test_readme_commands.py",
    "integration/test_harness.py",
    "integration/test_crash.py",
    "integration/test_trl_door.py",
)
"""The modules that took longest (1.5 to 5 minutes each, the TRL door's 1.3, in a 4-worker run on two cores, `--durations`),
longest first: they start before every other module, so none of them starts last and leaves three
workers idle at the end."""


def slow_modules_first(items: list[pytest.Item]) -> None:
    """The longest modules (`LONGEST_FIRST`), then the other modules with a slow test, then the rest (in
    place, keeping the order within a module). xdist hands modules out in this order (pyproject.toml's
    `--no-loadscope-reorder`; its default would order them by their number of tests)."""
    has_slow = {item.path for item in items if item.get_closest_marker("slow")}
    rank = {TESTS / name: place for place, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: (rank.get(item.path, len(rank)), item.path not in has_slow))


def in_worker(config: pytest.Config) -> bool:
    """This process is an xdist worker (not the controller, not a run without -n)."""
    return hasattr(config, "workerinput")
