"""The test session's temp-dir check (tests/support/tempdir.py) sees what a test or a process it started
left behind, and only that."""

from __future__ import annotations

import tempfile
from pathlib import Path

from tests.support.tempdir import LIBRARY_CACHES, SessionTemp, report


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
    held = tempfile.TemporaryDirectory(dir=tmp_path)  # removed by this process at its exit
    try:
        assert temp.leftovers() == ["stray.log", "swe-cache-abc"]
        assert "2 entries" in report(temp.leftovers(), tmp_path)
    finally:
        held.cleanup()
    temp.remove()
    assert not tmp_path.exists()
