"""Two checkouts on one host never mix: the second one's worker, demo and commands meet the first
one's embedded server on the same ports and task queue, and refuse it in one line naming both data
folders, before they start anything; and a demo that does not finish stops what it started.

As a user meets it: `python worker.py`, `rollouts demo` and `rollouts list` as processes, each
checkout with its own data folder and, where the test says so, its own ports."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporal_rollouts.runtime.services import port_open
from tests.support import REPO
from tests.support.processes import servers_under, users_worker
from tests.support.servers.process import free_port

pytestmark = pytest.mark.slow

ROLLOUTS = Path(sys.executable).with_name("rollouts")


def checkout(home: Path, ports: dict[str, str]) -> dict[str, str]:
    """The environment of one checkout's shell: its data folder, the given ports."""
    return {
        **os.environ,
        "ROLLOUTS_DATA_DIR": str(home / ".rollouts"),
        **ports,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def own_ports() -> dict[str, str]:
    return {
        "ROLLOUTS_TEMPORAL__EMBEDDED_PORT": str(free_port()),
        "ROLLOUTS_TEMPORAL__EMBEDDED_UI_PORT": str(free_port()),
        "ROLLOUTS_DEMO_POLICY__PORT": str(free_port()),
    }


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The first checkout: `python worker.py` on the embedded default, its own server and sandbox."""
    home = tmp_path_factory.mktemp("checkout-a")
    env = checkout(home, own_ports())
    with users_worker(home, env):
        yield env


def test_a_second_checkout_on_the_same_ports_is_refused_before_it_starts_anything(
    first: dict[str, str], tmp_path: Path
) -> None:
    ports = {name: value for name, value in first.items() if name.startswith("ROLLOUTS_") and "PORT" in name}
    second = checkout(tmp_path, ports)  # a fresh clone: another data folder, the same default ports
    theirs = first["ROLLOUTS_DATA_DIR"]

    demo = subprocess.run(
        [str(ROLLOUTS), "demo", "--items", "1"], cwd=tmp_path, env=second, capture_output=True, text=True, timeout=180
    )
    assert demo.returncode == 1, demo.stdout + demo.stderr
    (line,) = demo.stderr.strip().splitlines()
    assert line.startswith("error: task queue 'rollouts' on Temporal 127.0.0.1:") and f"({theirs})" in line, line
    assert "file://" in line and "ROLLOUTS_TEMPORAL__EMBEDDED_PORT=" in line and f"ROLLOUTS_DATA_DIR={theirs}" in line
    assert servers_under(tmp_path / ".rollouts") == []  # no sandbox of its own was left running

    listed = subprocess.run(
        [str(ROLLOUTS), "list"], cwd=tmp_path, env=second, capture_output=True, text=True, timeout=60
    )
    assert listed.returncode == 1 and "belongs to the workers of another data folder" in listed.stderr

    worker = subprocess.run(
        [sys.executable, str(REPO / "worker.py")], cwd=tmp_path, env=second, capture_output=True, text=True, timeout=120
    )
    assert worker.returncode != 0 and "belongs to the workers of another data folder" in worker.stderr
    assert servers_under(tmp_path / ".rollouts") == []


def test_a_demo_that_does_not_finish_stops_what_it_started(tmp_path: Path) -> None:
    """Ctrl-C in the middle of the demo: its own server, demo policy and sandbox stop with it."""
    env = checkout(tmp_path, own_ports())
    demo = subprocess.Popen(
        [str(ROLLOUTS), "demo", "--items", "12", "--group-size", "8"],  # 96 rollouts: still running at the Ctrl-C
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 180
        while not servers_under(tmp_path / ".rollouts"):  # it has started its services
            assert demo.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        time.sleep(1.0)
        demo.send_signal(signal.SIGINT)
        output, _ = demo.communicate(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert "stopped what it had started" in output, output
    assert servers_under(tmp_path / ".rollouts") == []
    assert not port_open("127.0.0.1", int(env["ROLLOUTS_TEMPORAL__EMBEDDED_PORT"]))
    assert not port_open("127.0.0.1", int(env["ROLLOUTS_DEMO_POLICY__PORT"]))
