"""The grader's last step in the slot: take the agent's source changes onto the fresh checkout
(already installed, so none of the agent's code ran during the install), add the canary to a graded
test file (`canary`), run the graded tests in chunks with the canary in each, and print the report
line.

Run as `python3 -I -S -c 'import sys; sys.path.insert(0, BIN); from grader.grade import main; ...'`
by the grading command (`envs.swe_smith.grading.grade_script`), which made every path it names.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from . import canary
from .changes import BaseTree, take_changes
from .pytest_run import clean_environment, instance_config, pytest_argv, run_chunk
from .report import report_line, summarize_changes


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grader.grade")
    parser.add_argument("--agent-repo", type=Path, required=True, help="the agent's repository, read only")
    parser.add_argument("--grader-root", type=Path, required=True, help="the grader's folder; repo/ is the checkout")
    parser.add_argument("--python", required=True, help="the grader venv's python")
    parser.add_argument("--chunk-size", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, required=True, help="of each pytest run")
    args = parser.parse_args(argv)
    root: Path = args.grader_root
    repo = root / "repo"
    targets = _lines(root / "targets")
    test_files = _lines(root / "test-files")

    base = BaseTree.parse((root / "base-tree").read_bytes())
    changes = take_changes(str(args.agent_repo), str(repo), base, frozenset(test_files))
    config = instance_config(repo, test_files)
    if config is None:
        config = root / "empty" / "pytest.ini"
        config.parent.mkdir()
        config.write_text("")
    canary_id = canary.plant(repo, targets)
    env = clean_environment(root)
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    canary_outcomes: list[str] = []
    for index, chunk in enumerate(chunks(targets, args.chunk_size)):
        ids = [*chunk, canary_id] if canary_id else chunk
        ids_file = root / f"chunk-{index}.args"
        ids_file.write_text("\n".join(ids) + "\n")
        argv_ = pytest_argv(args.python, repo, config, ids_file)
        found, said = run_chunk(argv_, repo, env, root / f"chunk-{index}.out", args.timeout_s, ids)
        if canary_id:
            canary_outcomes.append(found.pop(canary_id))
            said.pop(canary_id, None)
        outcomes.update(found)
        messages.update(said)
    changed = summarize_changes(changes.taken, changes.deleted, changes.ignored)
    print(report_line(targets, outcomes, messages, changed, canary_outcomes))
    return 0


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]
