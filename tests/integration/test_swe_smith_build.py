"""The task-set generator run on a small local sdist (no network): what it keeps is a real task,
and the same command gives the same commits and instances again."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path

import pytest

from envs.swe_smith import build
from envs.swe_smith.config import SHIPPED_WHEELS
from envs.swe_smith.model import SweInstance

pytestmark = pytest.mark.slow

MODULE = '''\
def clamp(value, low, high):
    """Keep value within [low, high]."""
    if value < low:
        return low
    if value > high:
        return high
    return value


def window(items, size):
    """Consecutive slices of `size` items."""
    out = []
    for start in range(len(items) - size + 1):
        out.append(items[start:start + size])
    return out
'''
TESTS = """\
from tinylib.core import clamp, window


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(30, 0, 10) == 10


def test_window():
    assert window([1, 2, 3, 4], 2) == [[1, 2], [2, 3], [3, 4]]


def test_window_whole():
    assert window([1, 2], 2) == [[1, 2]]
"""


def make_sdist(folder: Path) -> Path:
    source = folder / "src" / "tinylib-1.0"
    (source / "tinylib").mkdir(parents=True)
    (source / "tests").mkdir()
    (source / "setup.py").write_text(
        "from setuptools import setup\nsetup(name='tinylib', version='1.0', packages=['tinylib'])\n"
    )
    (source / "tinylib" / "__init__.py").write_text("")
    (source / "tinylib" / "core.py").write_text(MODULE)
    (source / "tests" / "test_core.py").write_text(TESTS)
    sdist = folder / "sdists" / "tinylib-1.0.tar.gz"
    sdist.parent.mkdir()
    with tarfile.open(sdist, "w:gz") as archive:
        archive.add(source, arcname="tinylib-1.0")
    return sdist.parent


def run_build(sdists: Path, out: Path) -> list[SweInstance]:
    argv = [
        "--out",
        str(out),
        "--project",
        "tinylib==1.0",
        "--sdist-dir",
        str(sdists),
        "--per-project",
        "3",
        "--wheels-from",
        str(SHIPPED_WHEELS),
    ]
    assert build.main(argv) == 0
    return [SweInstance.model_validate_json(line) for line in (out / "instances.jsonl").read_text().splitlines()]


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def test_generator_keeps_real_bugs_and_rebuilds_the_same(tmp_path: Path) -> None:
    sdists = make_sdist(tmp_path)
    instances = run_build(sdists, tmp_path / "out")
    assert len(instances) == 2, "three asked for, but at most one bug per function"
    assert {i.model_extra["mutation"]["function"] for i in instances} == {"clamp", "window"}
    bundle = tmp_path / "out" / "repos" / "tinylib-1.0.bundle"
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(bundle), str(clone)], check=True)
    everything = {
        f"tests/test_core.py::{name}"
        for name in ("test_clamp_inside", "test_clamp_low", "test_clamp_high", "test_window", "test_window_whole")
    }
    for instance in instances:
        assert instance.repo == "tinylib-1.0" and instance.FAIL_TO_PASS
        assert set(instance.FAIL_TO_PASS) | set(instance.PASS_TO_PASS) == everything
        assert not set(instance.FAIL_TO_PASS) & set(instance.PASS_TO_PASS)
        assert all(test in instance.problem_statement for test in instance.FAIL_TO_PASS)
        assert instance.model_extra["mutation"]["path"] == "tinylib/core.py"
        git(clone, "checkout", "-q", instance.base_commit)
        assert git(clone, "diff", "--stat", "HEAD~1", "--", "tests") == "", "the tests are never changed"
        (tmp_path / "fix.patch").write_text(instance.patch or "")
        git(clone, "apply", "--check", str(tmp_path / "fix.patch"))
        assert git(clone, "diff", "HEAD", "HEAD~1") == instance.patch, "the patch undoes exactly the bug"

    again = run_build(sdists, tmp_path / "again")
    assert [i.model_dump() for i in again] == [i.model_dump() for i in instances]
    assert (tmp_path / "again" / "repos" / "tinylib-1.0.bundle").read_bytes() == bundle.read_bytes()
    assert json.loads((tmp_path / "out" / "instances.jsonl").read_text().splitlines()[0])["instance_id"].startswith(
        "pypi__tinylib-1.0."
    )
