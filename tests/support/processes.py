"""`python worker.py` as a real process that tests can SIGKILL and start again."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from temporal_rollouts.core.settings import Settings
from tests.support import REPO


def settings_environment(settings: Settings) -> dict[str, str]:
    """The settings as ROLLOUTS_* variables (nested sections as JSON), as a user would set them."""
    env = {}
    for name, value in settings.model_dump(mode="json").items():
        env[f"ROLLOUTS_{name.upper()}"] = value if isinstance(value, str) else __import__("json").dumps(value)
    return env


def rollouts_process(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    """The `rollouts` command as a user runs it, configured through the environment (run it in a thread
    where the test process also runs the worker)."""
    return subprocess.run(
        [sys.executable, "-m", "temporal_rollouts.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **settings_environment(settings)},
    )


def run_rollouts_cli(settings: Settings, *args: str) -> str:
    """`rollouts_process`'s stdout, once it exits with 0 or 2 (done, or done with failed rollouts)."""
    done = rollouts_process(settings, *args)
    assert done.returncode in (0, 2), done.stderr
    return done.stdout


FAILOVER_STICKY_S = 5.0
"""The sticky-queue timeout of a worker that tests kill (`worker.sticky_queue_timeout_s`, 60 s by default):
a workflow task already waiting on a SIGKILLed worker's sticky queue goes to the shared queue after this
long. The failover is the same; the default made every kill cost its rollouts (and the pool's reaper)
a minute of waiting."""


class WorkerProcess:
    def __init__(self, settings: Settings, log_path: Path) -> None:
        worker = settings.worker.model_copy(update={"sticky_queue_timeout_s": FAILOVER_STICKY_S})
        self.settings = settings.model_copy(update={"worker": worker})
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
        if self.proc:
            stop_process(self.proc)

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


def stop_process(proc: subprocess.Popen, wait_s: float = 40.0) -> None:
    """SIGTERM, then SIGKILL after `wait_s`, and reap it; nothing when it has already ended."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(wait_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


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
