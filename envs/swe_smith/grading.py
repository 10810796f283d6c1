"""The shell steps of workspace setup and grading in the slot, and the reward.

Layout of a slot's workspace, the agent's to change as it likes:

    /workspace/<name>/        the repository at base_commit: a fresh git repository with one
                              commit of that tree, so no other commit (the fix) is in reach
    /workspace/.swe/wheels/   pytest's wheels, for the agent's own test runs

and of the container's cache, which only setup and grading commands see (read-only):

    /cache/repo-<digest>/repo.git   the bare repository, every commit (the fix included)
    /cache/wheels-<digest>/wheels/  the grader's wheels
    /cache/wheels-<digest>/site/    the same wheels installed, as pip puts them in site-packages

Grading is one command, and it works in that command's own /tmp, a tmpfs no other process of the
slot can see (the agent's commands and its stateful terminal each have their own): a fresh
checkout of base_commit from the cache, a venv with the installed wheels copied in, `pip install
-e .` of that pristine checkout, then the agent's changes to source files copied onto it (`grader.changes`) and the tests
run there with everything pinned (`grader.pytest_run`). Every folder above the checkout is the
grader's, so nothing the agent planted in or around its repository is seen, and none of the
agent's code runs before the tests import it. That code can still do anything once imported:
it is what is being tested.
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

from envs.swe_smith.grader import source_files
from envs.swe_smith.grader.report import INSTALLED_LINE, NOT_INSTALLED_LINE
from envs.swe_smith.transfer import SITE_NAME

SETUP_FOLDER = ".swe"
BASE_MARKER = ".git/swe-base-commit"
SOURCE_END = "__SWE_GRADER_SOURCE_END__"
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
    return f'src={fallback}\nrm -rf "$src"\n' + fetch


def _copy_wheels(wheels: str, folder: str) -> str:
    return f'rm -rf {folder}/wheels\ncp -R "${{SANDBOX_CACHE:-/cache}}"/{shlex.quote(wheels)}/wheels {folder}/wheels\n'


def setup_script(name: str, commit: str, repository: str | None, wheels: str, fetch: str | None = None) -> str:
    """Check out `commit` into /workspace/<name> from the cache entry `repository` (or with `fetch`,
    shell lines that fetch it into the bare repository $src) and copy the wheels from the cache entry
    `wheels` into `.swe/`; a second run finds it done and stops."""
    q_name, q_commit = shlex.quote(name), shlex.quote(commit)
    return (
        "set -eu\n"
        + CLEAN_ENVIRONMENT
        + f"if [ \"$(cat {q_name}/{BASE_MARKER} 2>/dev/null)\" = {q_commit} ]; then echo 'already set up'; exit 0; fi\n"
        + f"rm -rf {q_name} {SETUP_FOLDER}\nmkdir {SETUP_FOLDER}\n"
        + _source(repository, fetch, "$(mktemp -d)/src.git")
        + _copy_wheels(wheels, SETUP_FOLDER)
        + f"mkdir {q_name}\n{GIT_SOURCE} archive {q_commit} | tar -xf - -C {q_name}\n"
        + f"cd {q_name}\ngit init -q -b main\ngit add -A\n"
        + f"GIT_AUTHOR_DATE=2024-01-01T00:00:00Z GIT_COMMITTER_DATE=2024-01-01T00:00:00Z git {COMMIT_IDENTITY} commit -q -m 'base commit {commit[:12]}'\n"
        + f"echo {q_commit} > {BASE_MARKER}\n"
        + 'echo "checked out $(git rev-parse --short HEAD) in $PWD"\n'
    )


def grade_script(
    name: str,
    commit: str,
    repository: str | None,
    wheels: str,
    *,
    targets: Sequence[str],
    test_files: Sequence[str],
    offline: bool,
    install_timeout_s: float,
    test_timeout_s: float,
    chunk_size: int,
    fetch: str | None = None,
) -> str:
    """The whole grading of /workspace/<name> against `commit`, in the command's own /tmp; the output
    ends with the report line (`grader.report`)."""
    q_commit = shlex.quote(commit)
    index = "--no-index " if offline else ""
    files = {"targets": "\n".join(targets), "test-files": "\n".join(sorted(set(test_files)))}
    sources = source_files()
    if any(SOURCE_END in text for text in (*files.values(), *sources.values())):
        raise ValueError(f"a test id or grader file holds {SOURCE_END}, which ends the text the command writes")
    pip = '"$G/venv/bin/python" -I -m pip install -q --no-cache-dir --find-links "$G/wheels"'
    site = f'"${{SANDBOX_CACHE:-/cache}}"/{shlex.quote(wheels)}/{SITE_NAME}/.'
    purelib = '"$G/venv/bin/python" -I -c \'import sysconfig; print(sysconfig.get_path("purelib"))\''
    # The wheels come installed in the cache entry (`transfer`), and are copied as they are: pip
    # ran over the same wheels at every grading before.
    install = (
        'set -eu\npython3 -m venv --without-pip --system-site-packages "$G/venv"\n'
        f'cp -R {site} "$({purelib})"\n'
        f'cd "$G/repo"\n{pip} {index}--no-build-isolation -e .\n'
    )
    run = (
        "python3 -I -S -c 'import sys; sys.path.insert(0, sys.argv[1]); from grader.grade import main; "
        'sys.exit(main(sys.argv[2:]))\' "$G/bin" '
        f'--agent-repo /workspace/{shlex.quote(name)} --grader-root "$G" --python "$G/venv/bin/python" '
        f'--bin "$G/bin" --chunk-size {int(chunk_size)} --timeout-s {float(test_timeout_s)}\n'
    )
    # The cleanup may fail (a test left a folder it cannot write): under `set -e` that would end an
    # honest grading non-zero, which the env reads as the code under test stopping the grader.
    return (
        "set -eu -o pipefail\n"
        + CLEAN_ENVIRONMENT
        + 'export G="$(mktemp -d /tmp/swe-grader.XXXXXX)"\ntrap \'rm -rf "$G" || true\' EXIT\n'
        + 'mkdir "$G/bin" "$G/bin/grader" "$G/repo" "$G/home" "$G/tmp"\n'
        + "".join(_heredoc(f"$G/bin/grader/{file}", text) for file, text in sources.items())
        + "".join(_heredoc(f"$G/{file}", text) for file, text in files.items())
        + _heredoc("$G/install.sh", install)
        + _source(repository, fetch, '"$G/src.git"')
        + _copy_wheels(wheels, '"$G"')
        + f'{GIT_SOURCE} archive {q_commit} | tar -xf - -C "$G/repo"\n'
        + f'{GIT_SOURCE} ls-tree -r -z --full-tree {q_commit} > "$G/base-tree"\n'
        + f'if ! timeout -s KILL {float(install_timeout_s)} bash "$G/install.sh" > "$G/install.log" 2>&1; then\n'
        + f'  tail -c 4000 "$G/install.log"; echo; echo {shlex.quote(NOT_INSTALLED_LINE)}; exit 0\nfi\n'
        + 'rm -rf "$G/wheels" "$G/src.git" "$G/install.sh" "$G/install.log"\n'
        + f"echo {INSTALLED_LINE}\n"
        + run
    )


def _heredoc(path: str, text: str) -> str:
    return f"cat > \"{path}\" <<'{SOURCE_END}'\n{text.rstrip(chr(10))}\n{SOURCE_END}\n"


def test_file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def shaped_reward(tool_calls: int, installed: bool, tests_passed: bool) -> float:
    """The original's cold-start shaping: 0.0 with no tool calls; else 1.0 when the tests pass,
    else 0.4 once the install succeeds, else 0.05 a call up to 0.3."""
    if tool_calls == 0:
        return 0.0
    if tests_passed:
        return 1.0
    return 0.4 if installed else min(0.05 * tool_calls, 0.3)
