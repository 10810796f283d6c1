"""`python worker.py` as a real process that tests can SIGKILL and start again."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from temporal_rollouts.core.settings import Settings
from tests.support import REPO


def settings_environment(settings: Settings) -> dict[str, str]:
    """The settings as ROLLOUTS_* variables (nested sections as JSON), as a user would set them."""
    env = {}
    for name, value in settings.model_dump(mode="json").items():
        env[f"ROLLOUTS_{name.upper()}"] = value if isinstance(value, str) else __import__("json").dumps(value)
    return env


class WorkerProcess:
    def __init__(self, settings: Settings, log_path: Path) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.kills = 0

    def start(self) -> None:
        env = {**os.environ, **settings_environment(self.settings)}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "worker.py"], cwd=REPO, env=env, stdout=log, stderr=log)

    def kill(self) -> None:
        """SIGKILL: no drain, no cleanup, exactly like a crashed machine."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.kills += 1

    def restart(self) -> None:
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        """Until the worker logs that it polls its task queue."""
        deadline = time.monotonic() + timeout_s
        marker = "worker polling task queue"
        while time.monotonic() < deadline:
            assert self.proc is not None and self.proc.poll() is None, self.log_path.read_text()[-3000:]
            if self.log_path.exists() and self.log_path.read_text().count(marker) >= self.kills + 1:
                return
            time.sleep(0.1)
        raise AssertionError(f"worker not ready: {self.log_path.read_text()[-3000:]}")


@contextlib.contextmanager
def users_worker(home: Path, env: dict[str, str], timeout_s: float = 120.0) -> Iterator[subprocess.Popen[bytes]]:
    """`python worker.py` as a user starts it in `home` with `env` (the embedded default: its own server,
    sandbox and demo policy), once it polls; afterwards it is stopped, then `rollouts server stop` stops
    the rest, and any sandbox server under `home/.rollouts` is killed."""
    log = home / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, str(REPO / "worker.py")], cwd=home, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + timeout_s
        while "worker polling task queue" not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield worker
    finally:
        worker.terminate()
        worker.wait(60)
        rollouts = Path(sys.executable).with_name("rollouts")
        subprocess.run([str(rollouts), "server", "stop"], cwd=home, env=env, capture_output=True, timeout=120)
        kill_servers_under(Path(env.get("ROLLOUTS_DATA_DIR", home / ".rollouts")))


def command_lines() -> dict[int, str]:
    """Every process's command line by pid, its arguments joined by spaces (what `ps` shows)."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            found[int(proc.name)] = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
    return found


def servers_under(data_dir: Path) -> list[int]:
    """The sandbox servers whose root lies under `data_dir`."""
    marker = str(Path(data_dir).resolve())
    return [
        pid for pid, line in command_lines().items() if "temporal_rollouts.sandbox_server" in line and marker in line
    ]


def kill_servers_under(data_dir: Path) -> list[int]:
    """SIGKILL every sandbox server whose root lies under `data_dir`: what a test leaves behind
    when it kills processes on purpose (a container restarted twice, a worker killed mid-scale-up)."""
    killed = []
    for pid in servers_under(data_dir):
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed
