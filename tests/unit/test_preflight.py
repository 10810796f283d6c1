"""A machine without bubblewrap: `rollouts demo` and `python worker.py` stop before anything starts,
with one line naming the command that installs it, instead of running rollouts that all end in
`sandbox_error`. bubblewrap is hidden by a PATH that lacks it (apt-get stays, as on a bare Debian)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime import preflight
from temporal_rollouts.sandbox_server.isolation import bubblewrap
from tests.support import REPO

ROLLOUTS = Path(sys.executable).with_name("rollouts")


@pytest.fixture
def no_bubblewrap(tmp_path: Path) -> dict[str, str]:
    """A shell whose PATH has apt-get (when this machine has it) but no bwrap, and its own empty data folder."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("apt-get", "setpriv"):
        if found := _which(tool):
            (bin_dir / tool).symlink_to(found)
    env = {name: value for name, value in os.environ.items() if not name.startswith("ROLLOUTS_")}
    return env | {
        "PATH": str(bin_dir),
        "ROLLOUTS_DATA_DIR": str(tmp_path / "data"),
        "ROLLOUTS_TEMPORAL__EMBEDDED_PORT": "1",  # nothing may be started or reached
        "PYTHONPATH": str(REPO),
    }


def _which(tool: str) -> str | None:
    import shutil

    return shutil.which(tool)


def run(argv: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def expected_line() -> str:
    install = preflight.install_command("bubblewrap", *([] if preflight.has_libseccomp() else ["libseccomp2"]))
    return (
        f"error: the sandbox needs bubblewrap, which is not installed: {install} "
        "(or set sandbox.require_isolation = false to run commands UNISOLATED, for development only)"
    )


def test_the_demo_stops_before_anything_starts_with_one_line(no_bubblewrap, tmp_path: Path) -> None:
    done = run([str(ROLLOUTS), "demo"], no_bubblewrap, tmp_path)
    assert (done.returncode, done.stdout, done.stderr.strip()) == (1, "", expected_line())
    if _which("apt-get"):
        assert "apt-get install -y bubblewrap" in done.stderr
    assert not (tmp_path / "data").exists(), "nothing was started: no server, no sandbox, no data folder"


def test_the_worker_stops_before_anything_starts_with_the_same_line(no_bubblewrap, tmp_path: Path) -> None:
    done = run([sys.executable, str(REPO / "worker.py")], no_bubblewrap, tmp_path)
    assert done.returncode == 1 and done.stderr.strip() == expected_line(), done.stderr
    assert not (tmp_path / "data").exists()


def test_without_required_isolation_or_local_sandboxes_there_is_nothing_to_check(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    bubblewrap.bubblewrap_strategy.cache_clear()
    try:
        with pytest.raises(ConfigError, match="needs bubblewrap"):
            preflight.check_local_sandboxes(Settings())
        preflight.check_local_sandboxes(Settings(sandbox={"require_isolation": False}))
        preflight.check_local_sandboxes(Settings(sandbox={"backend": {"type": "local", "start_containers": False}}))
        static = {"type": "static", "servers": [{"container_id": "s0", "url": "http://10.0.0.9:8080"}]}
        preflight.check_local_sandboxes(Settings(sandbox={"backend": static}))
    finally:
        bubblewrap.bubblewrap_strategy.cache_clear()


def test_bubblewrap_that_cannot_build_a_sandbox_names_the_switch(monkeypatch) -> None:
    monkeypatch.setattr(preflight, "bubblewrap_strategy", lambda: None)
    monkeypatch.setattr(preflight.shutil, "which", lambda tool: f"/usr/bin/{tool}")
    monkeypatch.setattr(preflight, "running_as_root", lambda: False)
    monkeypatch.setattr(preflight, "_sysctl", lambda name: "1" if name.startswith("kernel.apparmor") else None)
    assert preflight.isolation_problem() == (
        "bubblewrap is installed but cannot build a sandbox here: allow unprivileged user namespaces "
        "(`sysctl -w kernel.apparmor_restrict_unprivileged_userns=0`) or run as root"
    )
