"""The swe_smith grader's in-slot parts on plain folders: which of the agent's files it takes onto
a fresh checkout (and how it refuses links, FIFOs, tests and configuration), which pytest
configuration file it pins, the report line's round trip, and the canary that shows a verdict the
code under test rewrote (the whole grade run with this interpreter's pytest)."""

from __future__ import annotations

import contextlib
import io
import os
import random
import re
import subprocess
import sys
from pathlib import Path

import pytest

from envs.swe_smith.grader import canary, grade, source_files
from envs.swe_smith.grader.changes import BaseTree, take_changes, why_not_source
from envs.swe_smith.grader.machinery import added_references
from envs.swe_smith.grader.pytest_run import instance_config
from envs.swe_smith.grader.pytest_summary import PYTEST_FLAGS, parse_summary
from envs.swe_smith.grader.report import (
    INSTALLED_LINE,
    NOT_INSTALLED_LINE,
    read_grading,
    read_report,
    report_line,
    summarize_changes,
)

BASE = {
    "setup.py": "from setuptools import setup\nsetup(name='pkg')\n",
    "pkg/__init__.py": "",
    "pkg/core.py": "def answer():\n    return 41\n",
    "pkg/data/words.txt": "alpha\n",
    "pkg/tests/__init__.py": "",
    "pkg/tests/test_core.py": "from pkg.core import answer\n\ndef test_answer():\n    assert answer() == 42\n",
    "tests/test_more.py": "def test_more():\n    pass\n",
    "conftest.py": "",
    "tox.ini": "[pytest]\naddopts = -q\n",
    "README.rst": "readme\n",
}


def checkout(folder: Path, files: dict[str, str]) -> Path:
    for path, text in files.items():
        (folder / path).parent.mkdir(parents=True, exist_ok=True)
        (folder / path).write_text(text)
    return folder


def base_tree(folder: Path) -> BaseTree:
    """The listing `git ls-tree -r -z` gives for `folder` committed as it is."""
    git = ["git", "-C", str(folder), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "-A"], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "base"], check=True)
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", "--full-tree", "HEAD"], check=True, capture_output=True)
    return BaseTree.parse(listing.stdout)


def trees(tmp_path: Path) -> tuple[Path, Path, BaseTree]:
    """(the agent's repository, the grader's fresh checkout, the base tree), both at the base."""
    agent = checkout(tmp_path / "agent", BASE)
    base = base_tree(agent)
    fresh = checkout(tmp_path / "fresh", BASE)
    return agent, fresh, base


def test_edits_deletions_and_additions_inside_the_packages_are_taken(tmp_path: Path) -> None:
    agent, fresh, base = trees(tmp_path)
    (agent / "pkg/core.py").write_text("from pkg.helper import value\n\ndef answer():\n    return value()\n")
    (agent / "pkg/helper.py").write_text("def value():\n    return 42\n")
    (agent / "pkg/sub").mkdir()
    (agent / "pkg/sub/__init__.py").write_text("")
    (agent / "pkg/data/words.txt").unlink()
    (agent / "README.rst").write_text("better readme\n")

    changes = take_changes(str(agent), str(fresh), base, frozenset())
    assert sorted(changes.taken) == ["README.rst", "pkg/core.py", "pkg/helper.py", "pkg/sub/__init__.py"]
    assert changes.deleted == ["pkg/data/words.txt"] and changes.ignored == {}
    assert (fresh / "pkg/helper.py").read_text() == (agent / "pkg/helper.py").read_text()
    assert not (fresh / "pkg/data/words.txt").exists()


def test_tests_configuration_and_planted_files_stay_as_the_base_has_them(tmp_path: Path) -> None:
    agent, fresh, base = trees(tmp_path)
    plants = {
        "conftest.py": "import evil\n",
        "pkg/conftest.py": "import evil\n",
        "tox.ini": "[pytest]\naddopts = -p evil\n",
        "setup.py": "import evil\n",
        "pkg/tests/test_core.py": "def test_answer():\n    pass\n",
        "pkg/tests/__init__.py": "import evil\n",
        "tests/test_more.py": "import evil\n",
        "pkg/sitecustomize.py": "import evil\n",
        "pkg/evil.pth": "import evil\n",
        "pkg/__pycache__/core.cpython-311.pyc": "x",
        "pkg/evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil\n",
        "pkg/.pytest.ini": "[pytest]\n",
        "evil.py": "import evil\n",
        "pytest.ini": "[pytest]\n",
        "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = evil\n",
    }
    checkout(agent, plants)
    before = {path: (fresh / path).read_text() for path in BASE}

    changes = take_changes(str(agent), str(fresh), base, frozenset({"tests/test_more.py"}))
    assert changes.taken == [] and changes.deleted == []
    assert {path: (fresh / path).read_text() for path in BASE} == before
    assert not [path for path in plants if path not in BASE and (fresh / path).exists()]
    assert changes.ignored["conftest.py"] == "configuration or packaging"
    assert changes.ignored["pkg/tests/test_core.py"] == "test file"
    assert changes.ignored["pkg/__pycache__/core.cpython-311.pyc"] == "bytecode or package metadata"
    assert changes.ignored["pkg/.pytest.ini"] == "hidden"
    assert changes.ignored["evil-1.0.dist-info"] == "outside the packages"
    assert changes.ignored["evil.py"] == "outside the packages"


def test_links_and_fifos_are_never_read_through(tmp_path: Path) -> None:
    agent, fresh, base = trees(tmp_path)
    outside = tmp_path / "outside.py"
    outside.write_text("def answer():\n    return 42\n")
    (agent / "pkg/core.py").unlink()
    (agent / "pkg/core.py").symlink_to(outside)
    os.mkfifo(agent / "pkg/pipe.py")
    (agent / "pkg/linked.py").symlink_to(outside)
    (agent / "pkg/data/words.txt").unlink()
    (agent / "pkg/data").rmdir()
    (agent / "pkg/data").symlink_to(tmp_path)  # a folder swapped for a link: its base files stay

    changes = take_changes(str(agent), str(fresh), base, frozenset())
    assert changes.taken == [] and changes.deleted == []
    assert changes.ignored["pkg/core.py"] == "a symbolic link"
    assert changes.ignored["pkg/linked.py"] == "a symbolic link"
    assert changes.ignored["pkg/pipe.py"] == "not a regular file"
    assert changes.ignored["pkg/data/words.txt"] == "a symbolic link"
    assert (fresh / "pkg/core.py").read_text() == BASE["pkg/core.py"]
    assert (fresh / "pkg/data/words.txt").read_text() == BASE["pkg/data/words.txt"]


def test_an_addition_never_replaces_what_the_install_made(tmp_path: Path) -> None:
    agent, fresh, base = trees(tmp_path)
    (fresh / "pkg/_version.py").write_text("version = '1.0'\n")
    (agent / "pkg/_version.py").write_text("version = 'forged'\n")
    changes = take_changes(str(agent), str(fresh), base, frozenset())
    assert changes.ignored == {"pkg/_version.py": "made by the grader's install"}
    assert (fresh / "pkg/_version.py").read_text() == "version = '1.0'\n"


def test_a_repository_replaced_by_a_link_gives_nothing(tmp_path: Path) -> None:
    agent, fresh, base = trees(tmp_path)
    moved = agent.rename(tmp_path / "moved")
    (moved / "pkg/core.py").write_text("def answer():\n    return 42\n")
    agent.symlink_to(moved)
    changes = take_changes(str(agent), str(fresh), base, frozenset())
    assert changes.taken == [] and list(changes.ignored) == ["."]


def test_what_counts_as_source() -> None:
    assert why_not_source("pkg/core.py") is None
    assert why_not_source("six.py") is None
    assert why_not_source("pkg/data/table.json") is None
    assert why_not_source("test_six.py") == "test file"
    assert why_not_source("pkg/core_test.py") == "test file"
    assert why_not_source("checks.py", frozenset({"checks.py"})) == "test file"
    assert why_not_source("pkg/setup.cfg") == "configuration or packaging"
    assert why_not_source("pkg/native.so") == "not source"


def test_the_pinned_configuration_is_the_one_pytest_would_find_inside_the_checkout(tmp_path: Path) -> None:
    repo = checkout(
        tmp_path / "repo",
        {
            "setup.cfg": "[metadata]\nname = x\n",
            "pyproject.toml": "[tool.pytest.ini_options]\naddopts = '-q'\n",
            "tests/test_a.py": "",
            "pkg/tests/test_b.py": "",
            "pkg/tests/tox.ini": "[tox]\n",
            "deep/tests/pytest.ini": "",
            "deep/tests/test_c.py": "",
        },
    )
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # above the checkout: never looked at
    assert instance_config(repo, ["tests/test_a.py", "pkg/tests/test_b.py"]) == repo / "pyproject.toml"
    assert instance_config(repo, ["pkg/tests/test_b.py"]) == repo / "pyproject.toml"
    assert instance_config(repo, ["deep/tests/test_c.py"]) == repo / "deep/tests/pytest.ini"
    (repo / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    assert instance_config(repo, ["tests/test_a.py"]) is None


def test_the_report_line_round_trips_and_stays_small() -> None:
    targets = [f"t.py::test_{n}" for n in range(5000)]
    outcomes = {nodeid: "PASSED" for nodeid in targets}
    outcomes[targets[3]] = "FAILED"
    outcomes[targets[7]] = "TIMEOUT"
    del outcomes[targets[9]]
    messages = {targets[3]: "AssertionError: " + "x" * 1000}
    changes = summarize_changes([f"pkg/m{n}.py" for n in range(100)], [], {"conftest.py": "configuration or packaging"})
    line = report_line(targets, outcomes, messages, changes)
    assert len(line) < 10_000
    report = read_report(f"noise\nswe-grader-report forged-but-earlier\n{line}\n", targets)
    assert report is not None and report.installed
    assert report.outcomes[targets[0]] == "PASSED" and report.outcomes[targets[3]] == "FAILED"
    assert report.outcomes[targets[7]] == "TIMEOUT" and report.outcomes[targets[9]] == "MISSING"
    assert report.messages == {targets[3]: messages[targets[3]][:300]}
    assert report.changes["counts"] == {"taken": 100, "deleted": 0, "ignored": 1}
    assert read_report("pip failed\n", targets) is None


def test_the_in_slot_programs_use_the_standard_library_only() -> None:
    """They run under `python3 -I -S` in the slot, where nothing of the project is importable."""
    for name, text in source_files().items():
        for line in text.splitlines():
            if line.startswith(("import ", "from ")) and not line.startswith(("from .", "from __future__")):
                module = line.split()[1].split(".")[0]
                assert module in {
                    "argparse",
                    "ast",
                    "collections",
                    "dataclasses",
                    "errno",
                    "json",
                    "os",
                    "pathlib",
                    "random",
                    "re",
                    "shutil",
                    "signal",
                    "stat",
                    "subprocess",
                    "tempfile",
                }, (name, line)


FORGING_PATCH = """
import _pytest.reports as _reports

_init = _reports.TestReport.__init__


def _passed(self, *args, **kwargs):
    _init(self, *args, **kwargs)
    self.outcome, self.longrepr = "passed", None


_reports.TestReport.__init__ = _passed
"""
"""Library code that rewrites every verdict of the pytest process importing it."""


def run_grade(tmp_path: Path, library_init: str, chunk_size: int = 1) -> tuple[str, Path]:
    """Grade an agent repository whose `pkg/__init__.py` is `library_init` (core.py fixed) with the
    real grader programs and this interpreter's pytest; (the report line, the grader's folder after)."""
    agent, fresh, _ = trees(tmp_path)
    (agent / "pkg/core.py").write_text("def answer():\n    return 42\n")
    (agent / "pkg/__init__.py").write_text(library_init)
    root = fresh.parent / "grader"
    root.mkdir()
    fresh.rename(root / "repo")
    for folder in ("home", "tmp"):
        (root / folder).mkdir()
    (root / "targets").write_text("\n".join(TARGETS) + "\n")
    (root / "test-files").write_text("pkg/tests/test_core.py\ntests/test_more.py\n")
    listing = subprocess.run(
        ["git", "-C", str(agent), "ls-tree", "-r", "-z", "--full-tree", "HEAD"], check=True, capture_output=True
    )
    (root / "base-tree").write_bytes(listing.stdout)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        argv = ["--agent-repo", str(agent), "--grader-root", str(root), "--python", sys.executable]
        assert grade.main([*argv, "--chunk-size", str(chunk_size), "--timeout-s", "60"]) == 0
    return printed.getvalue().strip(), root


TARGETS = ["pkg/tests/test_core.py::test_answer", "tests/test_more.py::test_more"]


def test_an_honest_fix_passes_and_each_runs_canary_fails(tmp_path: Path) -> None:
    line, root = run_grade(tmp_path, "")
    report = read_report(line, TARGETS)
    assert report is not None and set(report.outcomes.values()) == {"PASSED"}, line
    assert report.tampered is None and not report.machinery, line
    # two chunks: test_answer's canary is its clone (its assertion negated), test_more's a failing TestCase
    assert report.canary == "FF" and report.canary_templates == "P-", line
    core = (root / "repo/pkg/tests/test_core.py").read_text()
    assert core.count("def test_") == 2 and "assert answer() != 42" in core, core
    assert "self.fail()" in (root / "repo/tests/test_more.py").read_text()
    left = sorted(p.name for p in root.iterdir())
    assert left == ["home", "repo", "tmp"], "the graded ids, the base tree and the grader's code are gone"


def test_library_code_that_rewrites_every_verdict_is_caught_by_the_canary(tmp_path: Path) -> None:
    line, _ = run_grade(tmp_path, FORGING_PATCH, chunk_size=10)
    report = read_report(line, TARGETS)
    assert report is not None and set(report.outcomes.values()) == {"PASSED"}, line  # what pytest was made to say
    assert report.canary == "P" and "canary" in (report.tampered or ""), line
    assert report.machinery == {"pkg/__init__.py": ["TestReport", "_pytest"]}, line


def test_the_tests_run_out_of_sight_of_the_grader_and_the_agents_repository(tmp_path: Path) -> None:
    """What the library sees while it is tested: no graded-ids file, no base tree, no grader code, no
    agent repository (the agent's copy of the tests is what the canary's file differs from)."""
    probe = (
        "import os, pathlib\n"
        "root = pathlib.Path.cwd().parent\n"
        "seen = sorted(p.name for p in root.iterdir())\n"
        "agent = os.path.isdir(ROOT_OF_AGENT)\n"
        "pathlib.Path(os.environ['HOME'], 'seen').write_text(repr((seen, agent)))\n"
    )
    line, root = run_grade(tmp_path, probe.replace("ROOT_OF_AGENT", repr(str(tmp_path / "agent"))), chunk_size=10)
    report = read_report(line, TARGETS)
    assert report is not None, line
    if report.tests_in_sight is not None:
        pytest.skip(f"no sandbox for the tests here: {report.tests_in_sight}")
    assert (root / "home/seen").read_text() == repr((["home", "repo", "tmp"], False))


def test_a_grading_command_counts_only_when_it_ends_as_the_grader_ends_it() -> None:
    """After the install only the agent's code and the grader run: a command that then exits
    non-zero, times out or holds other than one report was stopped or forged by that code."""
    targets = ["t.py::test_a"]
    line = report_line(targets, {"t.py::test_a": "PASSED"}, {}, {}, ["FAILED"])
    honest = f"{INSTALLED_LINE}\n{line}\n"
    report = read_grading(honest, targets, 0, False)
    assert report is not None and report.outcomes == {"t.py::test_a": "PASSED"} and report.tampered is None
    for output, exit_code, timed_out in [
        (honest, 137, False),  # the grader killed after a report was written in its place
        (honest, None, True),  # frozen until the command's timeout
        (f"{INSTALLED_LINE}\n{line}\n{line}\n", 0, False),  # a second report, after the grader's
        (f"{INSTALLED_LINE}\nKilled\n", 1, False),  # killed before it reported
    ]:
        stopped = read_grading(output, targets, exit_code, timed_out)
        assert stopped is not None and stopped.installed and stopped.outcomes == {}, output
        assert "did not end with its one report" in (stopped.tampered or ""), output
    not_installed = read_grading(f"pip failed\n{NOT_INSTALLED_LINE}\n", targets, 0, False)
    assert not_installed is not None and not not_installed.installed and not_installed.tampered is None
    assert read_grading("bash: git: not found\n", targets, 127, False) is None  # before the install: not the agent


def test_the_report_carries_the_canarys_template_the_machinery_and_the_sandbox() -> None:
    targets = ["t.py::test_a"]
    line = report_line(
        targets,
        {"t.py::test_a": "PASSED"},
        {},
        {},
        ["PASSED", "FAILED"],
        ["FAILED", "-"],
        {"pkg/a.py": ["_pytest"]},
        "no",
    )
    report = read_report(line, targets)
    assert report is not None and (report.canary, report.canary_templates) == ("PF", "F-")
    assert report.machinery == {"pkg/a.py": ["_pytest"]} and report.tests_in_sight == "no"
    assert "test machinery" in (report.tampered or ""), "a canary that passed where its template failed is no sign"


def test_a_canary_is_forged_only_where_its_template_held_too() -> None:
    assert canary.forged("P", "P") and canary.forged("X", "X") and canary.forged("FP", "PP")
    assert canary.forged("P", "-") and canary.forged("P")  # a TestCase that always fails
    assert not canary.forged("P", "F") and not canary.forged("P", "x") and not canary.forged("FE?T", "PPPP")
    assert not canary.forged("", "")


CLONED = {
    "tests/test_x.py": (
        "import pytest\n\n\n"
        "def helper():\n    return 3\n\n\n"
        "@pytest.mark.parametrize('value, want', [(1, 2), (2, 3)])\n"
        "def test_add_one(value, want):\n    got = value + 1\n    assert got == want, 'off by one'\n\n\n"
        "def test_is_odd():\n    assert helper() % 2\n\n\n"
        "class TestThings:\n"
        "    def test_membership(self):\n        assert 'a' not in 'bcd'\n\n"
        "    def test_identity(self):\n        x = None\n        assert x is None\n"
    ),
    "tests/test_y.py": (
        "import unittest\n\n\n"
        "class CodecTests(unittest.TestCase):\n"
        "    def testEncodeLabels(self):\n        self.assertEqual('a'.upper(), 'A')\n\n"
        "    def testDecode(self):\n        self.assertTrue('x')\n"
    ),
}


@pytest.mark.parametrize(
    ("nodeid", "negated"),
    [
        ("tests/test_x.py::test_add_one[1-2]", "assert got != want, 'off by one'"),
        ("tests/test_x.py::test_is_odd", "assert not (helper() % 2)"),
        ("tests/test_x.py::TestThings::test_membership", "assert 'a' in 'bcd'"),
        ("tests/test_x.py::TestThings::test_identity", "assert x is not None"),
        ("tests/test_y.py::CodecTests::testEncodeLabels", "self.assertNotEqual('a'.upper(), 'A')"),
        ("tests/test_y.py::CodecTests::testDecode", "self.assertFalse('x')"),
    ],
)
def test_a_canary_is_a_clone_of_a_graded_test_in_its_style_and_scope_that_must_fail(
    tmp_path: Path, nodeid: str, negated: str
) -> None:
    """Named like the instance's tests, among them, with the template's decorators; where the
    template passes, pytest runs the clone and it fails."""
    repo = checkout(tmp_path / "repo", CLONED)
    words = canary.name_words([*CLONED_IDS, nodeid])
    planted = canary.plant(repo, [nodeid], words, random.Random(7))
    assert planted is not None and planted.template == nodeid
    file, *scope_and_name = planted.nodeid.split("::")
    template_scope, template_name = nodeid.split("::")[1:-1], nodeid.split("::")[-1].split("[")[0]
    assert scope_and_name[:-1] == template_scope, planted
    name = scope_and_name[-1]
    assert name.split("[")[0] != template_name and name.startswith("test")
    assert ("_" in template_name) == ("_" in name.split("[")[0]), "the template's style"
    assert ("[" in nodeid) == ("[" in name) and name.endswith(nodeid[nodeid.find("[") :] if "[" in nodeid else name)
    text = (repo / file).read_text()
    assert negated in text, text
    run = subprocess.run(
        [sys.executable, "-I", "-m", "pytest", *PYTEST_FLAGS, "-p", "no:randomly", nodeid, planted.nodeid],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "400"},
    )
    found, _ = parse_summary(run.stdout, {nodeid, planted.nodeid})
    assert found == {nodeid: "PASSED", planted.nodeid: "FAILED"}, run.stdout


CLONED_IDS = [
    "tests/test_x.py::test_add_one[1-2]",
    "tests/test_x.py::test_add_one[2-3]",
    "tests/test_x.py::test_is_odd",
    "tests/test_x.py::TestThings::test_membership",
    "tests/test_x.py::TestThings::test_identity",
    "tests/test_y.py::CodecTests::testEncodeLabels",
    "tests/test_y.py::CodecTests::testDecode",
]


def test_a_clone_runs_right_after_its_template_and_a_failing_testcase_anywhere() -> None:
    """A clone does what its template does: run before it, it changed what the tests in between saw (six's
    `test_lazy`, which checks that `html.parser` is not imported yet, failed an honest fix)."""
    run = [f"t.py::test_{n}" for n in range(6)]
    clone = canary.Canary("t.py::test_clone", "t.py::test_3")
    failing = canary.Canary("t.py::TestA::test_b", None)
    places = set()
    for seed in range(40):
        ordered = canary.run_order(run, clone, random.Random(seed))
        assert ordered == [*run[:4], clone.nodeid, *run[4:]]
        with_failing = canary.run_order(run, failing, random.Random(seed))
        assert sorted(with_failing) == sorted([*run, failing.nodeid]) and [i for i in with_failing if i in run] == run
        places.add(with_failing.index(failing.nodeid))
    assert len(places) > 3, "the failing TestCase's place is drawn"
    assert canary.run_order(run, None, random.Random(0)) == run


def test_canaries_of_one_grading_are_all_different(tmp_path: Path) -> None:
    repo = checkout(tmp_path / "repo", CLONED)
    words = canary.name_words(CLONED_IDS)
    rng = random.Random(3)
    planted = [canary.plant(repo, [nodeid], words, rng) for nodeid in CLONED_IDS]
    names = [p.nodeid for p in planted if p is not None]
    assert len(set(names)) == len(CLONED_IDS), names
    assert not any(re.search(r"::[A-Z][a-z]{11}::test_[a-z]{12}$", n) for n in names), "the old shape"


@pytest.mark.parametrize(
    ("config_file", "config"),
    [
        ("pytest.ini", "[pytest]\n"),
        ("pytest.ini", "[pytest]\npython_functions = check_*\npython_classes = Spec*\n"),
        ("pytest.ini", "[pytest]\npython_functions: check_*\n"),
        ("setup.cfg", "[tool:pytest]\npython_functions =\n    check_*\n"),
    ],
)
def test_pytest_collects_the_failing_canary_whatever_the_instance_configuration_names_tests(
    tmp_path: Path, config_file: str, config: str
) -> None:
    """The fallback canary (no template to clone): an id pytest cannot find makes it run nothing,
    which would fail an honest fix's every test."""
    repo = checkout(tmp_path / "repo", {"t/test_a.py": "def check_a():\n    pass\n", config_file: config})
    planted = canary.plant(repo, ["t/test_a.py::check_a"], ["alpha", "beta"], random.Random(1))
    assert planted is not None and planted.template is None
    run = subprocess.run(
        [sys.executable, "-I", "-m", "pytest", *PYTEST_FLAGS, "-c", config_file, planted.nodeid],
        cwd=repo,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1", "COLUMNS": "400"},
    )
    assert parse_summary(run.stdout, {planted.nodeid})[0] == {planted.nodeid: "FAILED"}, run.stdout


def test_the_canary_goes_into_a_regular_graded_test_file_only(tmp_path: Path) -> None:
    repo = checkout(tmp_path / "repo", {"tests/test_a.py": "def test_a():\n    assert 1\n", "docs/x.txt": "x"})
    (repo / "tests/test_link.py").symlink_to(repo / "tests/test_a.py")
    rng = random.Random(5)
    assert canary.plant(repo, ["docs/x.txt", "tests/test_missing.py::t"], ["a"], rng) is None
    planted = canary.plant(repo, ["tests/test_link.py::test_a", "tests/test_a.py::test_a"], ["a", "b"], rng)
    assert planted is not None and planted.nodeid.startswith("tests/test_a.py::")
    assert (repo / "tests/test_link.py").is_symlink()  # never written through


@pytest.mark.parametrize(
    ("base", "changed", "added"),
    [
        ("def f():\n    return 1\n", "def f():\n    return 2\n", []),
        ("x = 1\n", "import _pytest.reports\nx = 1\n", ["_pytest"]),
        ("x = 1\n", "import sys\nsys.modules['pytest'] = None\n", ["pytest", "sys.modules"]),
        ("x = 1\n", "import sys\nframe = sys._getframe(2).f_back\n", ["_getframe", "f_back"]),
        ("x = 1\n", "import gc\nobjs = gc.get_objects()\n", ["get_objects"]),
        ("x = 1\n", "import os\nos._exit(0)\n", ["_exit"]),
        ("x = 1\n", "def pytest_runtest_makereport(item, call):\n    pass\n", ["pytest_runtest_makereport"]),
        ("x = 1\n", "import importlib\nm = importlib.import_module('_pytest.reports')\n", ["_pytest"]),
        ("x = 1\n", "r = getattr(m, 'TestReport')\n", ["TestReport"]),
        ("x = 1\n", '"""Works like pytest and unittest."""\nx = 1  # pytest\n', []),
        ("import unittest\nunittest.main\n", "import unittest\nunittest.main\n", []),
        ("import unittest\n", "import unittest\nunittest.TestCase\n", ["TestCase"]),
    ],
)
def test_changes_that_reach_into_the_test_machinery_are_listed(base: str, changed: str, added: list[str]) -> None:
    assert added_references(base.encode(), changed.encode()) == added
    assert added_references(None, changed.encode()) == sorted(
        set(added) | set(added_references(None, changed.encode()))
    )
