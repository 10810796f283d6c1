"""The test session's temp-dir check (tests/support/tempdir.py) sees what a test or a process it started
left behind, and only that."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support import REPO
from tests.support.tempdir import LIBRARY_CACHES, SessionTemp, report, with_workers


def session_temp(folder: Path) -> SessionTemp:
    temp = object.__new__(SessionTemp)  # not __init__: that points this whole session's TMPDIR at it
    temp.host_temp, temp.folder = str(folder.parent), folder
    return temp


def test_leftovers_are_listed_and_what_is_removed_elsewhere_is_not(tmp_path: Path) -> None:
    temp = session_temp(tmp_path)
    (tmp_path / "swe-cache-abc").mkdir()
    (tmp_path / "stray.log").write_text("x")
    (tmp_path / "pytest-of-root").mkdir()  # pytest's own tmp_path folders
    (tmp_path / LIBRARY_CACHES).mkdir()  # torch's compile cache, pointed here on purpose
    (tmp_path / "tmpq1w2e3r4wandb-media").mkdir()  # wandb's, left by a process a test SIGKILLed
    (tmp_path / "wandb-notes").mkdir()  # anything else named after wandb still counts
    held = tempfile.TemporaryDirectory(dir=tmp_path)  # removed by this process at its exit
    try:
        assert temp.leftovers() == ["stray.log", "swe-cache-abc", "wandb-notes"]
        assert "3 entries" in report(temp.leftovers(), tmp_path)
    finally:
        held.cleanup()
    temp.remove()
    assert not tmp_path.exists()


def test_under_xdist_the_controller_counts_what_its_workers_left_and_not_their_folders() -> None:
    own = ["rollouts-tests-gw0", "rollouts-tests-gw1", "stray.log"]
    workers = {"rollouts-tests-gw1": ["leaked-x"], "rollouts-tests-gw0": []}
    assert with_workers(own, workers) == ["stray.log", "rollouts-tests-gw1/leaked-x"]


def test_a_file_a_worker_process_leaves_fails_the_run(tmp_path: Path) -> None:
    """The whole path: an xdist worker under this project's conftest, one of whose tests leaves a file in its temp dir."""
    (tmp_path / "test_leaves.py").write_text(
        "import tempfile\n\n\ndef test_leaves():\n    tempfile.mkstemp(prefix='leaked-')\n\n\ndef test_clean():\n    pass\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    argv = [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "tests.conftest", "-p", "no:cacheprovider"]
    done = subprocess.run([*argv, "test_leaves.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done.stdout[-3000:]
    assert "2 passed" in done.stdout and "left 1 entries" in done.stdout, done.stdout[-3000:]
    assert "/leaked-" in done.stdout, "named by its path under the worker's folder"
