"""One pytest run of the grader, steered only by the instance and the grader.

pytest looks for its configuration, its rootdir and conftest.py files in the folders above the
tests, loads plugins from every package on `sys.path`, and reads cached bytecode. In the fresh
checkout all of that is the instance's, and the folders above it are the grader's own, but the run
is pinned anyway: `--rootdir` and `--confcutdir` at the checkout, `-c` the configuration file pytest
would pick inside the checkout (or an empty one), plugin autoloading off, no cache provider, no
bytecode written, `python -I`, and an environment that names nothing of the workspace.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
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


def pytest_argv(python: str, repo: Path, config: Path, ids_file: Path) -> list[str]:
    return [
        python,
        "-I",
        "-m",
        "pytest",
        *PYTEST_FLAGS,
        "--rootdir",
        str(repo),
        "--confcutdir",
        str(repo),
        "-c",
        str(config),
        f"@{ids_file}",
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


def run_chunk(
    argv: list[str], repo: Path, env: dict[str, str], output: Path, timeout_s: float, nodeids: list[str]
) -> tuple[dict[str, str], dict[str, str]]:
    """Outcome and failure message by test id of one pytest run; ids it did not report are MISSING,
    or TIMEOUT when the run was killed for taking longer than `timeout_s` (with all it started)."""
    with output.open("wb") as sink:
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
    with output.open("rb") as results:
        results.seek(max(0, output.stat().st_size - OUTPUT_TAIL_BYTES))
        text = results.read().decode("utf-8", errors="replace")
    found, messages = parse_summary(text, set(nodeids))
    missing = "TIMEOUT" if timed_out else "MISSING"
    return {nodeid: found.get(nodeid, missing) for nodeid in nodeids}, messages
