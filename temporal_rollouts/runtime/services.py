"""Local helper processes a worker starts on the embedded default: the demo policy server.

Started detached (its own session), so it outlives the worker that started it and is
shared by every worker and CLI on the machine; a second start finds it listening.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import DEMO_POLICY, Settings

log = logging.getLogger(__name__)


def _demo_pid_file(settings: Settings) -> Path:
    return settings.data_dir / "demo_policy.pid"


def stop_by_pid_file(pid_file: Path, wait_s: float = 10.0) -> bool:
    """SIGTERM the process a pid file names, SIGKILL it after `wait_s`; True if it was running."""
    if not pid_file.exists():
        return False
    pid = int(pid_file.read_text())
    pid_file.unlink()
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True


def stop_demo_policy(settings: Settings) -> bool:
    """Stop the demo policy server a worker started; True if one was running."""
    return stop_by_pid_file(_demo_pid_file(settings))


def port_open(host: str, port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def start_detached(module: str, args: list[str], log_path: Path) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logfile:
        return subprocess.Popen(
            [sys.executable, "-m", module, *args],
            stdout=logfile,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_for_port(
    host: str, port: int, proc: subprocess.Popen, what: str, log_path: Path, wait_s: float = 30.0
) -> None:
    deadline = time.monotonic() + wait_s
    while not port_open(host, port):
        if proc.poll() is not None:
            raise ConfigError(f"{what} exited at start; see {log_path}")
        if time.monotonic() > deadline:
            raise ConfigError(f"{what} did not open {host}:{port} within {wait_s:.0f}s; see {log_path}")
        time.sleep(0.05)


def _warn_of_missing_env_modules(settings: Settings) -> None:
    """The demo policy already running was started with other env modules: their tasks are unknown to it."""
    import httpx

    try:
        health = httpx.get(f"http://{settings.demo_policy.host}:{settings.demo_policy.port}/health", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return
    if not isinstance(health, dict):
        return
    missing = [m for m in settings.env_modules if m not in (health.get("env_modules") or [])]
    if missing:
        log.warning(
            "the demo policy already running does not know the envs of %s: `rollouts server stop` stops it, and the "
            "next worker or batch starts it with them",
            ", ".join(missing),
        )


def ensure_demo_policy(settings: Settings) -> bool:
    """Start the demo policy server if the default policy is `demo` and none listens; True if started."""
    cfg = settings.demo_policy
    if settings.default_policy != DEMO_POLICY or not cfg.start_local:
        return False
    if port_open(cfg.host, cfg.port):
        _warn_of_missing_env_modules(settings)
        return False
    log_path = settings.data_dir / "demo_policy.log"
    env_modules = [arg for module in settings.env_modules for arg in ("--env-module", module)]
    harbor = [arg for path in cfg.harbor_tasks for arg in ("--harbor-tasks", path)]
    key = ["--api-key-env", cfg.api_key_env] if cfg.api_key_env else []  # the child inherits the variable
    proc = start_detached(
        "temporal_rollouts.policy_servers.demo",
        ["--host", cfg.host, "--port", str(cfg.port), *env_modules, *harbor, *key],
        log_path,
    )
    wait_for_port(cfg.host, cfg.port, proc, "the demo policy server", log_path)
    _demo_pid_file(settings).write_text(str(proc.pid))
    log.info("started the demo policy (a scripted test policy, not a model) at %s", settings.demo_policy_url)
    return True
