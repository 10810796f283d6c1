"""Harbor task folders read as Harbor writes them: what is honoured, what is reported, what is refused,
and the reward read as Harbor defines it."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import pytest

from envs.harbor.env import EXAMPLES, HarborEnv, _pack, read_reward
from envs.harbor.task import HarborTaskError, load_task, task_folders
from envs.base import as_loaded
from temporal_rollouts.cli.parsers import env_and_config
from temporal_rollouts.core.errors import BadItem, ConfigError, InvalidInput
from temporal_rollouts.core.records import TrajectoryInput
from temporal_rollouts.core.tasks import Item, ItemTimeouts
from temporal_rollouts.sandbox_server.schema import CollectedFile, ToolOutput, VerifierMounts


def make_task(root: Path, name: str = "task-a", toml: str = "", *, dockerfile: bool = True) -> Path:
    folder = root / name
    (folder / "tests").mkdir(parents=True)
    (folder / "environment").mkdir()
    (folder / "task.toml").write_text(toml)
    (folder / "instruction.md").write_text(f"Do {name}.\n")
    (folder / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    if dockerfile:
        (folder / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\nWORKDIR /app\n")
    return folder


def test_the_fields_harbor_defines_become_timeouts_limits_network_and_an_image(tmp_path: Path) -> None:
    folder = make_task(
        tmp_path,
        toml="""
version = "1.0"
[metadata]
difficulty = "hard"
[verifier]
timeout_sec = 90.0
env = { MODE = "strict" }
[agent]
timeout_sec = 300
[environment]
build_timeout_sec = 120.0
cpus = 2
memory = "2G"
storage_mb = 4096
network_mode = "no-network"
""",
    )
    task = load_task(folder)
    assert (task.agent_timeout_s, task.verifier_timeout_s, task.build_timeout_s) == (300.0, 90.0, 120.0)
    assert task.limits() == {"cpus": 2.0, "memory_limit_mb": 2048.0, "disk_limit_mb": 4096.0}
    assert task.wants_internet is False and task.verifier_env == {"MODE": "strict"}
    assert task.notes == () and task.instruction == "Do task-a.\n"

    env = HarborEnv({"path": str(tmp_path)})
    (item,) = as_loaded(env, env.load_items(1))
    assert item.id == "task-a" and item.image is not None
    assert item.image.context == str(folder.resolve() / "environment") and item.image.build_timeout_s == 120.0
    assert item.timeouts == ItemTimeouts(agent_s=300.0, verify_s=90.0)
    assert env.slot_limits(item) == task.limits() and env.slot_network(item) is False


def test_harbor_defaults_a_public_network_which_runs_without_one_unless_the_dataset_allows_it(tmp_path: Path) -> None:
    make_task(tmp_path, toml="")
    task = load_task(tmp_path / "task-a")
    assert task.wants_internet and task.verifier_timeout_s == 600.0 and task.agent_timeout_s is None
    item = Item(id="task-a")
    closed, open_ = HarborEnv({"path": str(tmp_path)}), HarborEnv({"path": str(tmp_path), "internet": True})
    assert closed.slot_network(item) is False and open_.slot_network(item) is True
    assert any("network" in note for note in closed.task_notes(task)), "the rollout says so in one line"
    assert not open_.task_notes(task)


def test_unknown_and_unsupported_fields_are_reported_per_task_never_dropped_in_silence(tmp_path: Path) -> None:
    make_task(
        tmp_path,
        toml="""
artifacts = ["/app/out"]
[verifier]
user = "tester"
env = { OPENAI_API_KEY = "${OPENAI_API_KEY}" }
[agent]
user = "agent"
[environment]
workdir = "/srv"
[[environment.mcp_servers]]
name = "x"
[solution]
env = { A = "b" }
""",
    )
    task = load_task(tmp_path / "task-a")
    text = "\n".join(task.notes)
    for field in ("artifacts", "[verifier] user", "[agent] user", "[environment] workdir", "mcp_servers", "[solution]"):
        assert field in text, (field, task.notes)
    assert "OPENAI_API_KEY" in text and task.verifier_env == {}, "a host variable is never filled from the worker"


@pytest.mark.parametrize(
    ("toml", "says"),
    [
        ("[verifier]\ntimeout_sec = -1", "[verifier] timeout_sec"),
        ("[agent]\ntimeout_sec = 'soon'", "[agent] timeout_sec"),
        ("[environment]\ncpus = 0", "[environment] cpus"),
        ("[environment]\nmemory = 'lots'", "[environment] memory"),
        ("[environment]\nmemory = '1G'\nmemory_mb = 512", "disagree"),
        ("[environment]\nos = 'windows'", "only linux"),
        ("[environment]\ngpus = 1", "no GPUs"),
        ("[environment]\nnetwork_mode = 'sometimes'", "network_mode"),
        ("[[steps]]\nname = 'one'", "multi-step"),
        ("[verifier]\nenvironment_mode = 'elsewhere'", "environment_mode"),
        ("[verifier\n", "cannot be read"),
    ],
)
def test_a_broken_task_toml_is_refused_naming_the_file_and_field(tmp_path: Path, toml: str, says: str) -> None:
    make_task(tmp_path, toml=toml)
    with pytest.raises(HarborTaskError) as caught:
        load_task(tmp_path / "task-a")
    assert says in str(caught.value) and str(tmp_path / "task-a" / "task.toml") in str(caught.value)


def test_a_task_needs_an_image_tests_and_an_instruction(tmp_path: Path) -> None:
    make_task(tmp_path, "no-image", dockerfile=False)
    with pytest.raises(HarborTaskError, match="no image"):
        load_task(tmp_path / "no-image")
    folder = make_task(tmp_path, "prebuilt", '[environment]\ndocker_image = "localhost/tasks/x:1"', dockerfile=False)
    item = as_loaded(HarborEnv({"path": str(folder)}), [Item(id="prebuilt")])[0]
    assert item.image is not None and item.image.reference == "localhost/tasks/x:1"
    (folder / "tests" / "test.sh").unlink()
    with pytest.raises(HarborTaskError, match="tests/test.sh"):
        load_task(folder)
    make_task(tmp_path, "no-from").joinpath("environment", "Dockerfile").write_text("RUN true\n")
    with pytest.raises(HarborTaskError, match="no-from/task.toml: environment/Dockerfile: .*no FROM"):
        load_task(tmp_path / "no-from")
    make_task(tmp_path, "silent").joinpath("instruction.md").write_text("  \n")
    with pytest.raises(HarborTaskError, match="empty"):
        load_task(tmp_path / "silent")


def test_a_dataset_is_checked_whole_at_its_first_step_and_items_are_task_names(tmp_path: Path) -> None:
    for name in ("b-task", "a-task"):
        make_task(tmp_path, name)
    (tmp_path / "notes").mkdir()  # a folder that is no task is not an item
    env = HarborEnv({"path": str(tmp_path)})
    assert env.item_count() == 2 and [i.id for i in env.load_items(3)] == ["a-task", "b-task", "a-task"]
    one = HarborEnv({"path": str(tmp_path / "b-task")})
    assert one.item_count() == 1 and [i.id for i in one.load_items(1)] == ["b-task"]
    with pytest.raises(BadItem):
        env.task(Item(id="../b-task"))
    (tmp_path / "b-task" / "task.toml").write_text("[agent]\ntimeout_sec = 0\n")
    with pytest.raises(ConfigError, match="b-task"):
        env.item_count()
    with pytest.raises(ConfigError, match="neither a Harbor task folder"):
        HarborEnv({"path": str(tmp_path / "notes")}).item_count()
    with pytest.raises(ConfigError, match="absolute"):
        HarborEnv({"path": "relative/tasks"}).item_count()
    with pytest.raises(ConfigError, match="verifier"):
        HarborEnv({"path": str(tmp_path / "a-task"), "verifier": "trusting"}).item_count()


def test_the_tasks_flag_checks_the_dataset_here_and_names_the_harbor_env(tmp_path: Path, capsys) -> None:
    make_task(tmp_path, toml="[agent]\nuser = 'x'\n")

    def flags(**given) -> argparse.Namespace:
        return argparse.Namespace(**{"env": None, "tasks": None, "env_config": None, **given})

    env, config, count = env_and_config(flags(tasks=str(tmp_path), env_config='{"verifier": "shared"}'))
    assert env == "harbor" and config == {"verifier": "shared", "path": str(tmp_path.resolve())} and count == 1
    assert "[agent] user" in capsys.readouterr().err
    with pytest.raises(InvalidInput, match="drop --env"):
        env_and_config(flags(tasks=str(tmp_path), env="terminal_tasks"))
    with pytest.raises(InvalidInput, match="--tasks PATH"):
        env_and_config(flags())
    (tmp_path / "task-a" / "task.toml").write_text("[environment]\ncpus = -2\n")
    with pytest.raises(ConfigError, match="cpus"):
        env_and_config(flags(tasks=str(tmp_path)))


def test_the_bundled_examples_are_valid_tasks_with_solutions() -> None:
    env = HarborEnv()
    tasks = env.check_all()
    assert len(tasks) == len(task_folders(EXAMPLES)) >= 3
    for task in tasks:
        assert env.reference_solution(Item(id=task.name)), task.name


@pytest.mark.parametrize(
    ("files", "rewards", "problem"),
    [
        ({"reward.txt": "1\n"}, {"reward": 1.0}, None),
        ({"reward.txt": "0.25"}, {"reward": 0.25}, None),
        ({"reward.txt": "0", "reward.json": '{"reward": 0.5, "style": 1}'}, {"reward": 0.5, "style": 1.0}, None),
        ({"reward.json": "0.75"}, {"reward": 0.75}, None),
        ({"reward.json": '{"accuracy": 1}'}, {"accuracy": 1.0}, None),
        ({}, {}, "wrote no reward"),
        ({"reward.txt": "passed"}, {}, "not a number"),
        ({"reward.txt": "nan"}, {}, "no finite numbers"),
        ({"reward.json": '{"reward": "1"}'}, {}, "no finite numbers"),
        ({"reward.json": "{}"}, {}, "no finite numbers"),
        ({"reward.json": "[1"}, {}, "not JSON"),
    ],
)
def test_the_reward_is_read_as_harbor_defines_it(files, rewards, problem) -> None:
    result = ToolOutput(call_id="c", ok=True, output="", collected={k: CollectedFile(text=v) for k, v in files.items()})
    found, why = read_reward(result)
    assert found == rewards
    assert (why is None) if problem is None else (problem in why)


def test_a_reward_the_server_would_not_read_is_a_failure_with_its_reason() -> None:
    result = ToolOutput(
        call_id="c", ok=True, output="", collected={"reward.txt": CollectedFile(problem="not a regular file")}
    )
    assert read_reward(result) == ({}, "/logs/verifier/reward.txt was not read: not a regular file")


def test_an_item_timeout_narrows_the_wall_clock_and_never_widens_it() -> None:
    def input_with(agent_s: float | None) -> TrajectoryInput:
        item = Item(id="x", timeouts=ItemTimeouts(agent_s=agent_s))
        return TrajectoryInput(env="harbor", item=item, limits={"wall_clock_s": 1000})

    assert input_with(300).narrowed_by_item().limits.wall_clock_s == 300
    assert input_with(5000).narrowed_by_item().limits.wall_clock_s == 1000
    assert input_with(None).narrowed_by_item().limits.wall_clock_s == 1000
    assert not math.isnan(input_with(1).narrowed_by_item().limits.wall_clock_s)


def test_tests_pack_to_the_same_bytes_every_time_and_leave_links_out(tmp_path: Path) -> None:
    folder = tmp_path / "tests"
    folder.mkdir()
    (folder / "test.sh").write_text("exit 0\n")
    (folder / "escape").symlink_to("/etc/passwd")
    first = _pack(folder)
    (folder / "test.sh").touch()
    assert _pack(folder) == first, "a content digest names the cache entry"
    import io
    import tarfile

    names = tarfile.open(fileobj=io.BytesIO(first)).getnames()
    assert names == ["test.sh"]


@pytest.mark.parametrize(
    "fields",
    [
        {"tests_at": "/tmp/tests"},
        {"output_at": "/proc/x"},
        {"tests_at": "/logs", "output_at": "/logs/verifier"},
        {"tests_at": "/a/../etc"},
        {"collect": ["../reward.txt"]},
        {"tests": "../other"},
    ],
)
def test_verifier_mounts_refuse_paths_that_are_the_sandboxs_own_or_leave_their_place(fields) -> None:
    with pytest.raises(ValueError):
        VerifierMounts(**fields)


def test_a_training_run_and_a_batch_take_a_harbor_dataset_by_one_flag(tmp_path: Path) -> None:
    from temporal_rollouts.cli.main import _batch_input, build_parser
    from temporal_rollouts.cli.train import feed_input
    from temporal_rollouts.core.settings import Settings

    make_task(tmp_path, "only")
    parser = build_parser()
    train = parser.parse_args(["train", "start", "run-1", "--tasks", str(tmp_path), "--policy", "http://p/v1"])
    feed = feed_input(train)
    assert (feed.env, feed.env_config) == ("harbor", {"path": str(tmp_path.resolve())})
    batch = _batch_input(parser.parse_args(["batch", "--tasks", str(tmp_path / "only")]), Settings())
    assert (batch.env, batch.env_config) == ("harbor", {"path": str((tmp_path / "only").resolve())})
    assert batch.num_items == 1, "a dataset's batch runs every task of it unless --items says otherwise"
    make_task(tmp_path, "second")
    assert _batch_input(parser.parse_args(["batch", "--tasks", str(tmp_path)]), Settings()).num_items == 2
    plain = _batch_input(parser.parse_args(["batch", "--env", "echo_chain"]), Settings())
    assert plain.num_items == 4


def test_the_demo_policy_plays_the_solutions_of_the_harbor_folders_it_is_given(tmp_path: Path) -> None:
    from temporal_rollouts.policy_servers.demo import SolutionIndex

    folder = make_task(tmp_path, "own-task")
    (folder / "solution").mkdir()
    (folder / "solution" / "solve.sh").write_text("echo solved > /app/out\n")
    assert SolutionIndex().lookup("Do own-task.") is None, "a folder it was not given is unknown to it"
    [[call]] = SolutionIndex(harbor_tasks=[str(tmp_path)]).lookup("Do own-task.")
    assert call.name == "terminal" and "bash /solution/solve.sh" in call.arguments["command"]
