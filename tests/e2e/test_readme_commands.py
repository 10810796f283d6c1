"""The README's everyday commands, run as a user runs them: `python worker.py` on the embedded
default (its own dev server, sandbox container and demo policy), then the installed `rollouts`
command and the `temporal` CLI against it. Ports and the data folder are the test's own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporal_rollouts.runtime.temporal import temporal_binary
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support import REPO
from tests.support.processes import kill_servers_under
from tests.support.servers.process import free_port

pytestmark = pytest.mark.slow

ROLLOUTS = Path(sys.executable).with_name("rollouts")


class Machine:
    """A user's shell: one environment for the worker and every command."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.temporal_port = free_port()
        self.env = {
            **os.environ,
            "ROLLOUTS_DATA_DIR": str(home / ".rollouts"),
            "ROLLOUTS_TEMPORAL__EMBEDDED_PORT": str(self.temporal_port),
            "ROLLOUTS_TEMPORAL__EMBEDDED_UI_PORT": str(free_port()),
            "ROLLOUTS_DEMO_POLICY__PORT": str(free_port()),
            # this checkout, as installed: its helper processes run `python -m temporal_rollouts....`
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }

    def run(self, *argv: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
        return subprocess.run(list(argv), cwd=self.home, env=self.env, capture_output=True, text=True, timeout=timeout_s)

    def rollouts_json(self, *args: str) -> dict | list:
        done = self.run(str(ROLLOUTS), *args, "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)


@pytest.fixture(scope="module")
def machine(tmp_path_factory) -> Iterator[Machine]:
    assert ROLLOUTS.exists(), "the `rollouts` command is installed with the project (make test does it)"
    user = Machine(tmp_path_factory.mktemp("home"))
    log = user.home / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen([sys.executable, str(REPO / "worker.py")], cwd=user.home, env=user.env,
                                  stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while "worker polling task queue" not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield user
    finally:
        worker.terminate()
        worker.wait(60)
        user.run(str(ROLLOUTS), "server", "stop")
        kill_servers_under(user.home / ".rollouts")


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
        temporal_binary(), "workflow", "start", "--address", f"127.0.0.1:{machine.temporal_port}",
        "--type", "BatchWorkflow", "--task-queue", "rollouts", "--workflow-id", "readme-batch",
        "--input", '{"env": "echo_chain", "num_items": 2, "group_size": 1}',
    )
    assert started.returncode == 0, started.stderr
    deadline = time.monotonic() + 120
    while (status := machine.rollouts_json("status", "readme-batch")).get("status") != "completed":
        assert time.monotonic() < deadline, status
        time.sleep(1)
    assert status["completed"] == 2 and status["mean_score"] == 1.0
