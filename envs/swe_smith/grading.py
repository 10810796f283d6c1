"""The shell steps of workspace setup and grading in the slot, and the reward.

Layout of a slot's workspace:

    /workspace/<name>/        the repository at base_commit: a fresh git repository with one
                              commit of that tree, so no other commit (the fix) is in reach
    /workspace/.swe/wheels/   pytest's wheels, for the agent's own test runs
    /workspace/.swe-grader/   made anew by verify: the wheels, the grader's venv

and of the container's cache, which only setup and grader-prepare commands see (read-only):

    /cache/repo-<digest>/repo.git   the bare repository, every commit (the fix included)
    /cache/wheels-<digest>/wheels/  the grader's wheels

Grading hygiene: every grader command runs with HOME=/tmp, no pip or git config, no user site
and `python -I` (the repository is not on sys.path except as the editable install puts it),
after the test files, conftest.py files, packaging and pytest configuration are put back as
they were at base_commit and planted files of the same kinds (and sitecustomize, .pth) removed.
The agent can still change what the project's own code does when imported: that is the task.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from envs.swe_smith.pytest_summary import PYTEST_FLAGS, SUMMARY_OUTCOMES

SETUP_FOLDER = ".swe"
GRADER_FOLDER = ".swe-grader"
BASE_MARKER = ".git/swe-base-commit"
RESTORED_FILES = r"^setup\.py$|(^|/)(conftest\.py|pytest\.ini|tox\.ini|setup\.cfg|pyproject\.toml)$"
PLANTED_FILES = (
    "conftest.py", "sitecustomize.py", "usercustomize.py", "*.pth",
    "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml", "setup.py",
)  # fmt: skip
"""Files that steer Python, pytest or the install: removed when base_commit does not have them."""
CLEAN_ENVIRONMENT = (
    "export HOME=/tmp GIT_TERMINAL_PROMPT=0 GIT_LFS_SKIP_SMUDGE=1 GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null "
    "PIP_CONFIG_FILE=/dev/null PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1 COLUMNS=400\n"
    "unset PYTHONPATH PYTHONSTARTUP PYTHONHOME BASH_ENV ENV\n"
)
GIT_SOURCE = "git -c safe.directory='*' --git-dir=\"$src\""
"""git on the bare repository $src, which may belong to another uid (the cache is the server's)."""
COMMIT_IDENTITY = "-c user.name=swe-smith -c user.email=swe-smith@invalid -c commit.gpgsign=false"


def _source(repository: str | None, fetch: str | None, fallback: str) -> str:
    """Shell lines that set $src to a bare repository holding the commit: the cache entry
    `repository`, or `fallback` filled by `fetch` (a remote repository)."""
    if repository is not None:
        return f'src="${{SANDBOX_CACHE:-/cache}}"/{shlex.quote(repository)}/repo.git\n'
    assert fetch is not None, "a repository comes from the cache or from a fetch"
    return f"src={fallback}\nrm -rf \"$src\"\n" + fetch


def _copy_wheels(wheels: str, folder: str) -> str:
    return f'rm -rf {folder}/wheels\ncp -R "${{SANDBOX_CACHE:-/cache}}"/{shlex.quote(wheels)}/wheels {folder}/wheels\n'


def setup_script(name: str, commit: str, repository: str | None, wheels: str, fetch: str | None = None) -> str:
    """Check out `commit` into /workspace/<name> from the cache entry `repository` (or with `fetch`,
    shell lines that fetch it into the bare repository $src) and copy the wheels from the cache entry
    `wheels` into `.swe/`; a second run finds it done and stops."""
    q_name, q_commit = shlex.quote(name), shlex.quote(commit)
    return (
        "set -eu\n" + CLEAN_ENVIRONMENT
        + f"if [ \"$(cat {q_name}/{BASE_MARKER} 2>/dev/null)\" = {q_commit} ]; then echo 'already set up'; exit 0; fi\n"
        + f"rm -rf {q_name} {SETUP_FOLDER}\nmkdir {SETUP_FOLDER}\n"
        + _source(repository, fetch, "$(mktemp -d)/src.git")
        + _copy_wheels(wheels, SETUP_FOLDER)
        + f"mkdir {q_name}\n{GIT_SOURCE} archive {q_commit} | tar -xf - -C {q_name}\n"
        + f"cd {q_name}\ngit init -q -b main\ngit add -A\n"
        + f"GIT_AUTHOR_DATE=2024-01-01T00:00:00Z GIT_COMMITTER_DATE=2024-01-01T00:00:00Z git {COMMIT_IDENTITY} commit -q -m 'base commit {commit[:12]}'\n"
        + f"echo {q_commit} > {BASE_MARKER}\n"
        + "echo \"checked out $(git rev-parse --short HEAD) in $PWD\"\n"
    )  # fmt: skip


def prepare_script(
    name: str, commit: str, test_files: Sequence[str], repository: str | None, wheels: str, fetch: str | None = None
) -> str:
    """Make the grader's folder anew with the wheels from the cache; put the test files and
    test/packaging configuration back as at `commit` (from the read-only cache entry `repository`,
    which the agent could never touch, or fetched anew); drop planted files."""
    grader = f"/workspace/{GRADER_FOLDER}"
    q_name, q_commit = shlex.quote(name), shlex.quote(commit)
    wanted = "\n".join(sorted(set(test_files)))
    finds = " -o ".join(f"-name {shlex.quote(pattern)}" for pattern in PLANTED_FILES)
    return (
        "set -eu\n" + CLEAN_ENVIRONMENT
        + f"[ -d {q_name} ] || {{ echo 'the repository folder {name} is gone'; exit 3; }}\n"
        + f"rm -rf {grader}\nmkdir {grader}\n"
        + _source(repository, fetch, f"{grader}/src.git") + _copy_wheels(wheels, grader)
        + f"{GIT_SOURCE} ls-tree -r --name-only {q_commit} > {grader}/base-files\n"
        + f"cat > {grader}/test-files <<'__FILES__'\n{wanted}\n__FILES__\n"
        + f"{{ grep -Fxf {grader}/test-files {grader}/base-files || true; grep -E '{RESTORED_FILES}' {grader}/base-files || true; }}"
        + f" | sort -u > {grader}/restore\n"
        + f"cd {q_name}\n"
        + f"find . -path ./.git -prune -o \\( {finds} \\) -type f -print | sed 's|^\\./||' | while IFS= read -r f; do\n"
        + f"  grep -Fxq \"$f\" {grader}/base-files || {{ echo \"removing planted $f\"; rm -f \"$f\"; }}\ndone\n"
        + f"[ -s {grader}/restore ] && {GIT_SOURCE} archive {q_commit} $(cat {grader}/restore) | tar -xf - -C .\n"
        + f"echo \"restored $(wc -l < {grader}/restore) files from base_commit\"\n"
    )  # fmt: skip


def install_script(name: str, offline: bool) -> str:
    """A venv that sees the system's packages, pytest from the wheelhouse, the repository editable."""
    grader = f"/workspace/{GRADER_FOLDER}"
    index = "--no-index " if offline else ""
    return (
        "set -eu\n" + CLEAN_ENVIRONMENT
        + f"rm -rf {grader}/venv\npython3 -m venv --without-pip --system-site-packages {grader}/venv\n"
        + f"{grader}/venv/bin/python -I -m pip install -q --no-cache-dir --no-index --find-links {grader}/wheels {grader}/wheels/*.whl\n"
        + f"cd {shlex.quote(name)}\n"
        + f"{grader}/venv/bin/python -I -m pip install -q --no-cache-dir {index}--find-links {grader}/wheels --no-build-isolation -e .\n"
        + "echo installed\n"
    )  # fmt: skip


def test_script(name: str, chunk: int, nodeids: Sequence[str]) -> str:
    """One pytest run over `nodeids` (passed through an @file, so no id is mangled by the shell). Only
    the summary lines and the last lines are printed, so the output cap never cuts a result away."""
    grader = f"/workspace/{GRADER_FOLDER}"
    ids = "\n".join(nodeids)
    flags = " ".join(PYTEST_FLAGS)
    return (
        CLEAN_ENVIRONMENT
        + f"cat > {grader}/chunk-{chunk}.args <<'__IDS__'\n{ids}\n__IDS__\n"
        + f"cd {shlex.quote(name)} || exit 3\n"
        + f"{grader}/venv/bin/python -I -m pytest {flags} @{grader}/chunk-{chunk}.args > {grader}/chunk-{chunk}.out 2>&1\n"
        + f"status=$?\ngrep -E '^({'|'.join(SUMMARY_OUTCOMES)}) ' {grader}/chunk-{chunk}.out\n"
        + f"tail -n 3 {grader}/chunk-{chunk}.out\nexit $status\n"
    )


def test_file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def chunks(items: Sequence[str], size: int) -> list[list[str]]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]


def shaped_reward(tool_calls: int, installed: bool, tests_passed: bool) -> float:
    """The original's cold-start shaping: 0.0 with no tool calls; else 1.0 when the tests pass,
    else 0.4 once the install succeeds, else 0.05 a call up to 0.3."""
    if tool_calls == 0:
        return 0.0
    if tests_passed:
        return 1.0
    return 0.4 if installed else min(0.05 * tool_calls, 0.3)
