"""The workspace fingerprint a one-shot terminal_tasks check is framed by: it sees every change of
content, kind, mode or link target anywhere in the tree, not a mere touch, and stays small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from envs.terminal_tasks import fingerprint as fingerprint_module
from envs.terminal_tasks.env import FINGERPRINT_COMMAND
from envs.terminal_tasks.fingerprint import BLIND_EXIT, LISTED_ENTRIES, OTHERS, Blind, changed, fingerprint


def workspace(root: Path) -> Path:
    (root / "calc").mkdir(parents=True)
    (root / "calc/ops.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "main.py").write_text("print(1)\n")
    (root / "link").symlink_to("main.py")
    return root


def test_every_change_below_a_top_level_entry_is_seen(tmp_path: Path) -> None:
    root = workspace(tmp_path / "w")
    before = fingerprint(str(root))
    os.utime(root / "calc/ops.py", (0, 0))
    assert changed(before, fingerprint(str(root))) == [], "times do not count"

    (root / "calc/ops.py").write_text("def add(a, b):\n    return a - b\n")
    assert changed(before, fingerprint(str(root))) == ["calc"]
    (root / "calc/ops.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "main.py").chmod(0o755)
    (root / "link").unlink()
    (root / "link").symlink_to("calc")
    (root / "new.txt").write_text("")
    assert changed(before, fingerprint(str(root))) == ["link", "main.py", "new.txt"]


def test_many_entries_share_one_digest_and_names_are_cut(tmp_path: Path) -> None:
    root = tmp_path / "w"
    root.mkdir()
    for n in range(LISTED_ENTRIES + 50):
        (root / f"{n:04d}-{'x' * 200}").write_text(str(n))
    prints = fingerprint(str(root))
    assert len(prints) == LISTED_ENTRIES + 1 and OTHERS in prints
    assert max(len(name) for name in prints) <= 100
    before = dict(prints)
    (root / f"{LISTED_ENTRIES + 10:04d}-{'x' * 200}").write_text("changed")
    assert changed(before, fingerprint(str(root))) == [OTHERS]


def test_the_command_runs_the_module_as_sent(tmp_path: Path) -> None:
    root = workspace(tmp_path / "w")
    command = FINGERPRINT_COMMAND.replace(" /workspace ", f" {root} ").replace("python3", sys.executable, 1)
    assert " --read-only " in command, "it asks for a read-only workspace, as the check sees it"
    done = subprocess.run(["bash", "-c", command.replace(" --read-only ", " ")], capture_output=True, text=True)
    assert done.returncode == 0 and json.loads(done.stdout) == fingerprint(str(root))
    writable = subprocess.run(["bash", "-c", command], capture_output=True, text=True)
    assert writable.returncode == BLIND_EXIT, writable
    assert writable.stdout.startswith("cannot fingerprint the workspace: the workspace is writable"), writable.stdout


@pytest.mark.parametrize("blinded", ["root", "folder", "file", "vanished"])
def test_what_it_cannot_see_fails_it_instead_of_matching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, blinded: str
) -> None:
    """An unlistable workspace once gave one "unreadable" digest before and after a check, equal whatever
    changed between them: the agent could blind the defence with `chmod 0300 /workspace`."""
    root = workspace(tmp_path / "w")
    target = {"root": root, "folder": root / "calc", "file": root / "calc/ops.py", "vanished": root / "main.py"}[
        blinded
    ]
    listdir, open_, lstat = os.listdir, os.open, os.lstat

    def refused(path: object, *args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied")

    def patched(real):  # type: ignore[no-untyped-def]
        return lambda path, *a, **k: refused(path) if Path(path) == target else real(path, *a, **k)

    monkeypatch.setattr(fingerprint_module.os, "listdir", patched(listdir))
    monkeypatch.setattr(fingerprint_module.os, "open", patched(open_))
    if blinded == "vanished":
        monkeypatch.setattr(fingerprint_module.os, "lstat", patched(lstat))
    with pytest.raises(Blind, match="Permission denied"):
        fingerprint(str(root))


def test_a_deep_tree_is_walked_without_recursion(tmp_path: Path) -> None:
    """Deeper than Python's recursion limit (pathlib's mkdir and shutil's rmtree recurse: this test
    makes and removes its tree itself)."""
    root = workspace(tmp_path / "w")
    levels = [str(root.joinpath(*["d"] * depth)) for depth in range(1, 1201)]
    for folder in levels:
        os.mkdir(folder)
    try:
        Path(levels[-1], "leaf").write_text("x")
        before = fingerprint(str(root))
        Path(levels[-1], "leaf").write_text("y")
        assert changed(before, fingerprint(str(root))) == ["d"]
    finally:
        Path(levels[-1], "leaf").unlink()
        for folder in reversed(levels):
            os.rmdir(folder)
