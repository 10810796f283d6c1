"""The grader's last step in the slot: plant a canary for each pytest run in the untouched checkout
(already installed) and check that pytest collects them, take the agent's source changes onto it
(so none of the agent's code ran until now), run the graded tests in chunks with their canary, each
out of sight of the grader's files and the workspace, and print the report line.

Run as `python3 -I -S -c 'import sys; sys.path.insert(0, BIN); from grader.grade import main; ...'`
by the grading command (`envs.swe_smith.grading.grade_script`), which made every path it names.
The files that name the graded tests and the base tree, and the grader's own code, are read and
removed before any of the agent's code runs.
"""

from __future__ import annotations

import argparse
import random
import shutil
from collections.abc import Sequence
from pathlib import Path

from . import canary
from .changes import BaseTree, take_changes
from .machinery import added_references
from .pytest_run import clean_environment, collected, hidden_from_tests, instance_config, pytest_argv, run_chunk
from .report import report_line, summarize_changes

GRADER_FILES = ("targets", "test-files", "base-tree")


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="grader.grade")
    parser.add_argument("--agent-repo", type=Path, required=True, help="the agent's repository, read only")
    parser.add_argument("--grader-root", type=Path, required=True, help="the grader's folder; repo/ is the checkout")
    parser.add_argument("--python", required=True, help="the grader venv's python")
    parser.add_argument("--chunk-size", type=int, required=True)
    parser.add_argument("--timeout-s", type=float, required=True, help="of each pytest run")
    parser.add_argument("--bin", type=Path, default=None, help="the grader's own code, removed once it is loaded")
    args = parser.parse_args(argv)
    root: Path = args.grader_root
    repo = root / "repo"
    targets = _lines(root / "targets")
    test_files = _lines(root / "test-files")
    base = BaseTree.parse((root / "base-tree").read_bytes())
    for name in GRADER_FILES:
        (root / name).unlink()
    if args.bin is not None:
        shutil.rmtree(args.bin, ignore_errors=True)
    hidden, not_hidden = hidden_from_tests(root, args.python)

    config = instance_config(repo, test_files)
    if config is None:
        config = root / "home" / "pytest.ini"
        config.write_text("")
    env = clean_environment(root)
    runs = chunks(targets, args.chunk_size)
    collect = [*hidden, *pytest_argv(args.python, repo, config, [])]
    canaries, planted = _plant_canaries(repo, runs, targets, collect, args.timeout_s)

    # The canaries' files as planted, put back after the agent's changes are taken (tests are never
    # taken, so the agent's copies of them cannot stand in for the planted ones).
    for path, text in planted.items():
        path.write_bytes(text[0])
    changes = take_changes(str(args.agent_repo), str(repo), base, frozenset(test_files))
    for path, text in planted.items():
        path.write_bytes(text[1])
    machinery = {
        path: found
        for path, before in changes.sources.items()
        if (found := added_references(before, (repo / path).read_bytes()))
    }

    rng = random.SystemRandom()
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    canary_codes: list[str] = []
    template_codes: list[str] = []
    for run, planted_canary in zip(runs, canaries, strict=True):
        ids = canary.run_order(run, planted_canary, rng)
        found, said = run_chunk([*hidden, *pytest_argv(args.python, repo, config, ids)], repo, env, args.timeout_s, ids)
        if planted_canary is not None:
            canary_codes.append(found.pop(planted_canary.nodeid))
            said.pop(planted_canary.nodeid, None)
            template = planted_canary.template
            template_codes.append(canary.NO_TEMPLATE if template is None else found.get(template, "MISSING"))
        outcomes.update(found)
        messages.update(said)
    changed = summarize_changes(changes.taken, changes.deleted, changes.ignored)
    print(report_line(targets, outcomes, messages, changed, canary_codes, template_codes, machinery, not_hidden))
    return 0


def _plant_canaries(
    repo: Path, runs: list[list[str]], targets: list[str], collect: list[str], timeout_s: float
) -> tuple[list[canary.Canary | None], dict[Path, tuple[bytes, bytes]]]:
    """A canary for each run, planted in the untouched checkout (none of the agent's code is there yet,
    so the collection is the base's): a clone of a graded test where pytest collects it, else a failing
    TestCase. Returns them, and each changed file's text before and after."""
    rng = random.SystemRandom()
    words = canary.name_words(targets)
    files = {repo / nodeid.split("::", 1)[0] for nodeid in targets}
    before = {path: path.read_bytes() for path in files if path.is_file() and not path.is_symlink()}
    known = canary.known_names(targets)
    canaries = [canary.plant(repo, run, words, rng, known) for run in runs]
    ids = [c.nodeid for c in canaries if c is not None]
    seen = collected(collect + ids, repo, clean_environment(repo.parent), timeout_s, ids) if ids else set()
    for index, planted in enumerate(canaries):
        if planted is not None and planted.nodeid not in seen:
            canaries[index] = canary.plant_failing(repo, runs[index], words, rng)
    planted_files = {path: (text, path.read_bytes()) for path, text in before.items() if path.read_bytes() != text}
    return canaries, planted_files


def _lines(path: Path) -> list[str]:
    return [line for line in path.read_text(encoding="utf-8").splitlines() if line]
