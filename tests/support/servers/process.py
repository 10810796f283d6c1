"""A server a test talks to, run as a real process on a free loopback port."""

from __future__ import annotations

import itertools
import os
import random
import socket
import subprocess
from pathlib import Path
from typing import Any

from temporal_rollouts.runtime.services import wait_for_port
from tests.support import REPO

HOST = "127.0.0.1"

PORTS_PER_WORKER = 1000
FIRST_PORT = 20000
"""Ports handed out lie below the kernel's ephemeral range (32768 up), each xdist worker in its own
thousand: a port asked of the kernel (bind to 0) is free only until someone binds it, and under
parallel workers another worker's server or any outgoing connection could take it first."""


def _worker_ports() -> range:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    start = FIRST_PORT + (index % 12) * PORTS_PER_WORKER
    return range(start, start + PORTS_PER_WORKER)


_PORTS = _worker_ports()
_next_port = itertools.cycle(random.sample(_PORTS, len(_PORTS)))
"""This process's ports in a shuffled cycle: no port twice in a thousand, and another process of the
same worker (a helper a test runs) most likely starts elsewhere in the cycle."""


def free_port(host: str = HOST) -> int:
    """A port nothing on `host` holds now, from this worker's own range."""
    for _ in range(len(_PORTS)):
        port = next(_next_port)
        with socket.socket() as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
        return port
    raise RuntimeError(f"no free port on {host} in {_PORTS}")


class LoopbackServer:
    """Start with `launch(argv)`, wait for its port with `wait_ready()`; `stop()` terminates it,
    killing it after `stop_wait_s`. Its output goes to `log_path`."""

    what = "server"
    stop_wait_s = 10.0

    def __init__(self, log_path: Path, port: int | None = None) -> None:
        self.port = port or free_port()
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def launch(self, argv: list[str], **popen: Any) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, **popen)

    def wait_ready(self, wait_s: float = 30.0) -> None:
        assert self.proc is not None
        wait_for_port(HOST, self.port, self.proc, self.what, self.log_path, wait_s=wait_s)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(self.stop_wait_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(self.stop_wait_s)
