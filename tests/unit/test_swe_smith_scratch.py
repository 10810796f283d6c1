"""What the worker builds to send a repository to sandboxes is removed when dropped and at exit, and a
worker that died without exiting has its leftovers removed by the next one (`envs/swe_smith/scratch.py`).
A long run over many repositories, with worker restarts, used to leave a folder in the temp dir for
every cache entry it ever built."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from envs.swe_smith import scratch
from envs.swe_smith.config import SweSmithConfig
from envs.swe_smith.loader import read_instances
from envs.swe_smith.scratch import LOCK, PREFIX, ScratchCache, sweep
from tests.support import REPO

BUILD_ONE_ENTRY = """
import sys
from envs.swe_smith.transfer import local_bundle, repository_entry
name, archive = repository_entry(local_bundle(sys.argv[1], sys.argv[2]))
print(archive, flush=True)
if sys.argv[3] == "wait":
    sys.stdin.read()
"""


def shipped_repo() -> tuple[str, str]:
    settings = SweSmithConfig()
    instance = next(iter(read_instances(settings.dataset).values()))
    return settings.repo_base_url, instance.repo


def build_in_child(temp: Path, wait: bool) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", BUILD_ONE_ENTRY, *shipped_repo(), "wait" if wait else "exit"],
        cwd=REPO,
        env={**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_worker_leaves_nothing_in_the_temp_dir_at_exit(tmp_path: Path) -> None:
    child = build_in_child(tmp_path, wait=False)
    archive, _ = child.communicate(timeout=120)
    assert child.returncode == 0 and archive.strip().endswith("entry.tar.gz")
    assert list(tmp_path.iterdir()) == []


def test_a_worker_killed_leaves_a_folder_the_next_one_removes(tmp_path: Path) -> None:
    child = build_in_child(tmp_path, wait=True)
    archive = Path(child.stdout.readline().strip())
    assert archive.is_file()
    child.send_signal(signal.SIGKILL)
    child.wait()
    (left,) = tmp_path.iterdir()
    assert left.name.startswith(PREFIX)
    assert sweep(tmp_path) == [], "a folder seconds old may be one whose process has not locked it yet"
    os.utime(left, (time.time() - 120, time.time() - 120))
    assert sweep(tmp_path) == [left] and not left.exists()


def test_a_running_workers_folder_is_never_swept(tmp_path: Path) -> None:
    child = build_in_child(tmp_path, wait=True)
    try:
        assert Path(child.stdout.readline().strip()).is_file()
        (folder,) = tmp_path.iterdir()
        os.utime(folder, (time.time() - 120, time.time() - 120))
        assert sweep(tmp_path) == [] and folder.is_dir()
    finally:
        child.communicate("", timeout=60)
    assert list(tmp_path.iterdir()) == []


def test_an_entry_the_cache_drops_is_removed_at_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(scratch.tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(scratch, "PROCESS_FOLDER", scratch._ProcessFolder())
    cache: ScratchCache[Path] = ScratchCache("thing", capacity=2)
    built: list[str] = []

    def build(key: str):
        def make(folder: Path) -> Path:
            built.append(key)
            (folder / "payload").write_text(key)
            return folder / "payload"

        return make

    first = cache.get("a", build("a"))
    assert cache.get("a", build("a")) == first and built == ["a"]
    cache.get("b", build("b"))
    cache.get("c", build("c"))  # drops a, the least recently used
    assert not first.exists() and built == ["a", "b", "c"]
    assert cache.get("a", build("a")).read_text() == "a" and built == ["a", "b", "c", "a"]
    with pytest.raises(ZeroDivisionError):
        cache.get("d", lambda folder: 1 / 0)
    (process_folder,) = tmp_path.iterdir()
    assert sorted(p.name.split("-")[0] for p in process_folder.iterdir() if p.name != LOCK) == ["thing", "thing"]
    cache.clear()
    assert [p.name for p in process_folder.iterdir()] == [LOCK]
    scratch.PROCESS_FOLDER.remove()
    assert list(tmp_path.iterdir()) == []
