"""Two checkouts on one host never mix: the second one's worker, demo and commands meet the first
one's embedded server on the same ports and task queue, and refuse it in one line naming both data
folders, before they start anything; and a demo that does not finish stops what it started.

As a user meets it: `python worker.py`, `rollouts demo` and `rollouts list` as processes, each
checkout with its own data folder and, where the test says so, its own ports."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporal_rollouts.runtime.services import port_open
from tests.support import REPO
from tests.support.processes import servers_under
from tests.support.user_shell import ROLLOUTS, Machine, worker_running

pytestmark = pytest.mark.slow


def checkout(home: Path, ports: dict[str, str]) -> Machine:
    """One checkout's shell: its own data folder, the given ports."""
    shell = Machine(home)
    shell.env.update(ports)
    return shell


@pytest.fixture(scope="module")
def first(tmp_path_factory) -> Iterator[Machine]:
    """The first checkout: `python worker.py` on the embedded default, its own server and sandbox."""
    shell = Machine(tmp_path_factory.mktemp("checkout-a"))
    with worker_running(shell):
        yield shell


def test_a_second_checkout_on_the_same_ports_is_refused_before_it_starts_anything(
    first: Machine, tmp_path: Path
) -> None:
    ports = {name: value for name, value in first.env.items() if name.startswith("ROLLOUTS_") and "PORT" in name}
    second = checkout(tmp_path, ports)  # a fresh clone: another data folder, the same default ports
    theirs = first.env["ROLLOUTS_DATA_DIR"]

    demo = second.run(str(ROLLOUTS), "demo", "--items", "1")
    assert demo.returncode == 1, demo.stdout + demo.stderr
    (line,) = demo.stderr.strip().splitlines()
    assert line.startswith("error: task queue 'rollouts' on Temporal 127.0.0.1:") and f"({theirs})" in line, line
    assert "file://" in line and "ROLLOUTS_TEMPORAL__EMBEDDED_PORT=" in line and f"ROLLOUTS_DATA_DIR={theirs}" in line
    assert servers_under(tmp_path / ".rollouts") == []  # no sandbox of its own was left running

    listed = second.run(str(ROLLOUTS), "list", timeout_s=60)
    assert listed.returncode == 1 and "belongs to the workers of another data folder" in listed.stderr

    worker = second.run(sys.executable, str(REPO / "worker.py"), timeout_s=120)
    assert worker.returncode != 0 and "belongs to the workers of another data folder" in worker.stderr
    assert servers_under(tmp_path / ".rollouts") == []


def test_a_demo_that_does_not_finish_stops_what_it_started(tmp_path: Path) -> None:
    """Ctrl-C in the middle of the demo: its own server, demo policy and sandbox stop with it."""
    shell = Machine(tmp_path)
    demo = subprocess.Popen(
        [str(ROLLOUTS), "demo", "--items", "12", "--group-size", "8"],  # 96 rollouts: still running at the Ctrl-C
        cwd=tmp_path,
        env=shell.env,
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
    assert not port_open("127.0.0.1", shell.temporal_port)
    assert not port_open("127.0.0.1", int(shell.env["ROLLOUTS_DEMO_POLICY__PORT"]))
