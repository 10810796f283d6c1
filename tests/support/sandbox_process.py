"""A sandbox server run the way something other than this project runs it (Kubernetes, a Nomad
task, a Modal sandbox): `python -m temporal_rollouts.sandbox_server` with its token in an
environment variable, on a given loopback address and port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

from tests.support import REPO
from tests.support.servers.process import free_port

TOKEN_ENV = "SANDBOX_TOKEN"


class SandboxProcess:
    def __init__(self, root: Path, container_id: str, token: str, host: str = "127.0.0.1", slots: int = 2) -> None:
        self.root, self.container_id, self.token, self.host, self.slots = root, container_id, token, host, slots
        self.port = free_port(host)
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, wait_s: float = 30.0) -> SandboxProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, TOKEN_ENV: self.token, "PYTHONPATH": str(REPO)}
        argv = [
            sys.executable,
            "-m",
            "temporal_rollouts.sandbox_server",
            "--host",
            self.host,
            "--port",
            str(self.port),
            "--slots",
            str(self.slots),
            "--root",
            str(self.root / "root"),
            "--token-env",
            TOKEN_ENV,
            "--container-id",
            self.container_id,
            "--sweep-interval",
            "0.3",
        ]
        with open(self.root / "server.log", "ab") as log:
            self.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sandbox server exited: {(self.root / 'server.log').read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).is_success:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"sandbox server {self.container_id} did not answer within {wait_s}s")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
