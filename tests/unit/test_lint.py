"""The tree passes ruff: its linter with the rules pyproject.toml selects (bugs, dead code, modern
spellings), and its formatter (no file it would change)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def ruff(*args: str) -> subprocess.CompletedProcess:
    found = shutil.which("ruff", path=str(Path(sys.executable).parent)) or shutil.which("ruff")
    if found is None:
        pytest.fail("ruff is not installed: pip install -e '.[test]'")
    return subprocess.run([found, *args], cwd=ROOT, capture_output=True, text=True)


def test_ruff_check_finds_nothing() -> None:
    done = ruff("check", "--no-cache", ".")
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_ruff_format_would_change_nothing() -> None:
    done = ruff("format", "--check", "--no-cache", ".")
    assert done.returncode == 0, "run `ruff format .`:\n" + done.stdout[-4000:] + done.stderr[-2000:]
