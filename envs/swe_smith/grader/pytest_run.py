"""One pytest run of the grader, steered only by the instance and the grader, and out of sight of both.

pytest looks for its configuration, its rootdir and conftest.py files in the folders above the
tests, loads plugins from every package on `sys.path`, and reads cached bytecode. In the fresh
checkout all of that is the instance's, and the folders above it are the grader's own, but the run
is pinned anyway: `--rootdir` and `--confcutdir` at the checkout, `-c` the configuration file pytest
would pick inside the checkout (or an empty one), plugin autoloading off, no cache provider, no
bytecode written, `python -I`, and an environment that names nothing of the workspace.

The tests run the agent's code, which could look for what tells the grader's canary (`canary`) from
the instance's tests: the grader's own files (the graded ids, the base tree, its code), the agent's
copy of the test files in /workspace, the instance's history in the container's cache. So where the
slot lets it, pytest runs in a sandbox of its own inside the grading command (`hidden_from_tests`:
bubblewrap in a user namespace of the slot's uid, which can mount nothing back): /workspace, /cache
and /tmp are empty folders there, but for the checkout, the venv and the grader's HOME and TMPDIR. A
slot where that cannot be built runs the tests without it, and the report says so. The test ids go
on pytest's command line, and what pytest prints goes to a file with no name.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from .pytest_summary import PYTEST_FLAGS, parse_summary

CONFIG_FILES = ("pytest.ini", ".pytest.ini", "pyproject.toml", "tox.ini", "setup.cfg")
"""pytest's own order of preference within one folder."""
CONFIG_SECTIONS = {
    "pyproject.toml": re.compile(r"^\s*\[tool\.pytest\.ini_options\]\s*$", re.MULTILINE),
    "tox.ini": re.compile(r"^\s*\[pytest\]\s*$", re.MULTILINE),
    "setup.cfg": re.compile(r"^\s*\[tool:pytest\]\s*$", re.MULTILINE),
}
"""A file of these names configures pytest only when it has this section (pytest.ini always does)."""
SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"
OUTPUT_TAIL_BYTES = 8 * 1024 * 1024
HIDDEN = ("/workspace", "/cache", "/tmp")
"""Folders the tests see empty (the checkout, the venv and the grader's HOME and TMPDIR, under /tmp, are
mounted back)."""
PROBE_TIMEOUT_S = 30.0


def instance_config(repo: Path, test_files: list[str]) -> Path | None:
    """The configuration file pytest would use for these test files in the checkout `repo`: the first
    one found from the folder that holds them all up to the checkout's root, never above it."""
    folders = [Path(path).parent.parts for path in test_files] or [()]
    common: tuple[str, ...] = folders[0]
    for parts in folders[1:]:
        depth = 0
        while depth < min(len(common), len(parts)) and common[depth] == parts[depth]:
            depth += 1
        common = common[:depth]
    for depth in range(len(common), -1, -1):
        folder = repo.joinpath(*common[:depth])
        for name in CONFIG_FILES:
            candidate = folder / name
            if candidate.is_file() and not candidate.is_symlink() and _configures_pytest(candidate):
                return candidate
    return None


def _configures_pytest(path: Path) -> bool:
    pattern = CONFIG_SECTIONS.get(path.name)
    return pattern is None or bool(pattern.search(path.read_text(encoding="utf-8", errors="replace")))


def hidden_from_tests(grader_root: Path, python: str) -> tuple[list[str], str | None]:
    """The argv prefix that runs a test command where it sees nothing of the grader, the workspace or
    the cache (see the module's docstring), and None; or [] and why no such sandbox can be built here."""
    bwrap = shutil.which("bwrap", path=SANDBOX_PATH)
    if bwrap is None:
        return [], "bubblewrap is not installed in the slot"
    venv = Path(python).parent.parent
    keep = [grader_root / "repo", grader_root / "home", grader_root / "tmp"]
    argv = [bwrap, "--unshare-user", "--die-with-parent", "--ro-bind", "/", "/"]
    argv += ["--dev-bind", "/dev", "/dev", "--bind", "/proc", "/proc"]
    for folder in HIDDEN:
        if os.path.isdir(folder):
            argv += ["--tmpfs", folder]
    for folder in keep:
        argv += ["--bind", str(folder), str(folder)]
    argv += ["--ro-bind", str(venv), str(venv), "--chdir", str(grader_root / "repo"), "--"]
    try:
        probe = subprocess.run(
            [*argv, "true"], capture_output=True, timeout=PROBE_TIMEOUT_S, env={"PATH": SANDBOX_PATH}, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        return [], f"bubblewrap cannot start here: {err}"
    if probe.returncode != 0:
        return [], "bubblewrap cannot build a sandbox in the slot: " + probe.stderr.decode(errors="replace")[-300:]
    return argv, None


def pytest_argv(python: str, repo: Path, config: Path, nodeids: Sequence[str]) -> list[str]:
    return [
        python,
        "-I",  # which also ignores PYTHONDONTWRITEBYTECODE: -B says it, so no run leaves bytecode a later one reads
        "-B",
        "-m",
        "pytest",
        *PYTEST_FLAGS,
        "--rootdir",
        str(repo),
        "--confcutdir",
        str(repo),
        "-c",
        str(config),
        *nodeids,
    ]


def clean_environment(grader_root: Path) -> dict[str, str]:
    """The whole environment of a test run: nothing inherited, nothing of the workspace."""
    return {
        "PATH": SANDBOX_PATH,
        "HOME": str(grader_root / "home"),
        "TMPDIR": str(grader_root / "tmp"),
        "LANG": "C.UTF-8",
        "COLUMNS": "400",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
        "GIT_CEILING_DIRECTORIES": str(grader_root),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_CONFIG_GLOBAL": "/dev/null",
    }


def run_pytest(argv: list[str], repo: Path, env: dict[str, str], timeout_s: float) -> tuple[str, bool]:
    """What the command printed (its tail) and whether it was killed for taking longer than `timeout_s`
    (with all it started). Its output goes to an unnamed file, so no later run can read it."""
    with tempfile.TemporaryFile(dir=repo.parent) as sink:
        process = subprocess.Popen(
            argv,
            cwd=repo,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            process.wait(timeout=timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process.wait()
        size = sink.seek(0, os.SEEK_END)
        sink.seek(max(0, size - OUTPUT_TAIL_BYTES))
        return sink.read().decode("utf-8", errors="replace"), timed_out


def collected(argv: list[str], repo: Path, env: dict[str, str], timeout_s: float, nodeids: Sequence[str]) -> set[str]:
    """Which of `nodeids` pytest collects (`argv`: a run of them, to which `--collect-only` is added)."""
    text, _ = run_pytest([*argv, "--collect-only", "--verbosity=-1"], repo, env, timeout_s)  # one id a line
    wanted = set(nodeids)
    return {line.strip() for line in text.splitlines() if line.strip() in wanted}


def run_chunk(
    argv: list[str], repo: Path, env: dict[str, str], timeout_s: float, nodeids: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Outcome and failure message by test id of one pytest run; ids it did not report are MISSING,
    or TIMEOUT when the run was killed for taking longer than `timeout_s` (with all it started)."""
    text, timed_out = run_pytest(argv, repo, env, timeout_s)
    found, messages = parse_summary(text, set(nodeids))
    missing = "TIMEOUT" if timed_out else "MISSING"
    return {nodeid: found.get(nodeid, missing) for nodeid in nodeids}, messages
