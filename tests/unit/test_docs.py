"""The documentation site builds in MkDocs' strict mode: a broken link or a page missing from the
nav fails here, as it would fail the site's build."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import REPO

MKDOCS = Path(sys.executable).with_name("mkdocs")


def build(config: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )


@pytest.fixture(autouse=True)
def _mkdocs() -> None:
    if not MKDOCS.exists():
        pytest.skip("mkdocs is not installed (the test extra installs it)")


def test_the_site_builds_strictly(tmp_path: Path) -> None:
    done = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "training" / "index.html").exists()


def test_a_broken_link_fails_the_build(tmp_path: Path) -> None:
    copy = tmp_path / "repo"
    shutil.copytree(REPO / "docs", copy / "docs")
    shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
    (copy / "docs" / "index.md").write_text("[gone](no-such-page.md)\n")
    done = build(copy / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0 and "no-such-page.md" in done.stdout + done.stderr
