"""A server a test talks to, run as a real process on a free loopback port."""

from __future__ import annotations

import socket
import subprocess
from pathlib import Path
from typing import Any

from temporal_rollouts.runtime.services import wait_for_port
from tests.support import REPO

HOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


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
