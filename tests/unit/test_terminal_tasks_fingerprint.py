"""The workspace fingerprint a one-shot terminal_tasks check is framed by: it sees every change of
content, kind, mode or link target anywhere in the tree, not a mere touch, and stays small."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from envs.terminal_tasks.env import FINGERPRINT_COMMAND
from envs.terminal_tasks.fingerprint import LISTED_ENTRIES, OTHERS, changed, fingerprint


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
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout) == fingerprint(str(root))
