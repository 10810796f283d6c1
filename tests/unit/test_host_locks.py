"""tests/support/parallel.py: a `host_lock` name is held by one test at a time on the whole host, whichever
process (xdist worker, another session) runs it; other names do not wait."""

from __future__ import annotations

import fcntl
import os
import threading
from pathlib import Path

import pytest

from tests.support import parallel
from tests.support.tempdir import HOST_TEMP


@pytest.fixture
def host_temp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOST_TEMP, str(tmp_path))
    return tmp_path


def test_a_second_holder_of_a_name_waits_until_the_first_lets_go(host_temp: Path) -> None:
    entered = threading.Event()

    def second() -> None:
        with parallel.host_locks(["uids"]):  # its own open file: flock holds it apart as it would another process
            entered.set()

    with parallel.host_locks(["uids", "other"]):
        waiting = threading.Thread(target=second)
        waiting.start()
        assert not entered.wait(0.5), "two holders of one name at once"
    assert entered.wait(10)
    waiting.join()


def test_other_names_do_not_wait(host_temp: Path) -> None:
    with parallel.host_locks(["a"]), parallel.host_locks(["b"]):
        pass
    assert sorted(p.name for p in (host_temp / parallel.LOCKS).iterdir()) == ["a", "b"]


def test_a_name_that_is_not_a_file_name_is_refused(host_temp: Path) -> None:
    with pytest.raises(ValueError, match="host lock"), parallel.host_locks(["../x"]):
        pass


@pytest.mark.host_lock("test-host-locks-probe")
def test_a_marked_test_holds_its_name_while_it_runs() -> None:
    fd = os.open(parallel.lock_folder() / "test-host-locks-probe", os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    finally:
        os.close(fd)
