"""bubblewrap.run_command on its own: what a command can see, how it dies, how much it may print."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
import tracemalloc

import pytest

from temporal_rollouts.core.errors import SandboxRequired
from temporal_rollouts.sandbox_server.config import SlotLimits
from temporal_rollouts.sandbox_server.isolation import bubblewrap
from temporal_rollouts.sandbox_server.isolation.bubblewrap import SlotSandbox, run_command
from temporal_rollouts.sandbox_server.files.output import BoundedOutput, cap_text
from temporal_rollouts.sandbox_server.limits.confinement import Confinement
from tests.support.sandbox import host_listener, needs_bubblewrap, processes_running, unique_sleep

ALLOWED_ROOT_ENTRIES = {"bin", "dev", "etc", "lib", "lib32", "lib64", "proc", "sbin", "tmp", "usr", "workspace"}


@pytest.fixture(params=["bubblewrap", "none"])
def mode(request, monkeypatch) -> str:
    if request.param == "bubblewrap":
        if bubblewrap.bubblewrap_path() is None:
            pytest.skip("bubblewrap cannot build a sandbox here")
    else:
        monkeypatch.setattr(bubblewrap, "bubblewrap_path", lambda: None)
    return request.param


OWN_UID_BASE = 63500
"""The uid these commands run as, away from the low end of the range the suite's sandbox servers claim
slot uids from: a server that releases its slot 0 stops every process of that uid, which once killed a
command here (exit 137) while another test worker ran beside this one."""


@functools.cache
def own_confinement() -> Confinement:
    return Confinement.detect(SlotLimits.off(), OWN_UID_BASE, "isolation-tests")


async def run(command: str, workspace, timeout_s: float = 10.0, **options):
    sandbox = {name: options.pop(name) for name in ("allow_network", "require_isolation") if name in options}
    if bubblewrap.bubblewrap_path() is None:  # the "none" mode: running unisolated must be asked for
        sandbox.setdefault("require_isolation", False)
    sandbox.setdefault("confinement", own_confinement())
    return await run_command(
        command,
        SlotSandbox(workspace, **sandbox),
        timeout_s=timeout_s,
        max_output_chars=options.pop("cap", 10_000),
        **options,
    )


@needs_bubblewrap
async def test_command_sees_only_its_workspace_and_system_dirs(tmp_path):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (tmp_path / "host-secret.txt").write_text("do not read")
    result = await run(f"pwd; echo HOME=$HOME; ls /; cat {tmp_path}/host-secret.txt; ls /work /root", workspace)
    lines = result.output.splitlines()
    assert lines[0] == "/workspace"
    assert lines[1] == "HOME=/workspace"
    root_entries = {line for line in lines[2:] if not line.startswith(("cat:", "ls:"))}
    assert root_entries <= ALLOWED_ROOT_ENTRIES and "workspace" in root_entries
    assert "do not read" not in result.output
    assert "No such file or directory" in result.output
    assert result.exit_code != 0


@needs_bubblewrap
async def test_environment_is_clean_and_system_dirs_are_read_only(tmp_path, monkeypatch):
    monkeypatch.setenv("SANDBOX_TEST_SECRET", "leaked")
    result = await run("env; touch /usr/x /etc/x 2>&1; echo ok > /tmp/t && cat /tmp/t", tmp_path)
    env = dict(line.split("=", 1) for line in result.output.splitlines() if "=" in line)
    assert env["PATH"] == "/usr/local/bin:/usr/bin:/bin"
    assert env["LANG"] == "C.UTF-8" and env["TERM"] == "dumb"
    assert "SANDBOX_TEST_SECRET" not in result.output
    assert result.output.count("Read-only file system") == 2
    assert result.output.rstrip().endswith("ok")


async def test_timeout_kills_the_whole_process_tree(tmp_path, mode):
    marker = unique_sleep()
    started = time.monotonic()
    result = await run(f"(sleep 1; touch late) & sleep {marker}", tmp_path, timeout_s=0.5)
    assert result.timed_out and result.exit_code != 0
    assert time.monotonic() - started < 3
    await asyncio.sleep(1.5)
    assert not (tmp_path / "late").exists()
    assert processes_running(marker) == []


async def test_background_children_neither_hang_the_read_nor_survive(tmp_path, mode):
    marker = unique_sleep()
    started = time.monotonic()
    result = await run(f"sleep {marker} & (sleep 1; touch late) & echo started", tmp_path, timeout_s=30)
    assert time.monotonic() - started < 3
    assert result.output == "started\n" and result.exit_code == 0 and not result.timed_out
    await asyncio.sleep(1.5)
    assert not (tmp_path / "late").exists()
    assert processes_running(marker) == []


async def test_exit_code_and_merged_output(tmp_path, mode):
    result = await run("echo out; echo err >&2; exit 3", tmp_path)
    assert result.exit_code == 3
    assert result.output == "out\nerr\n"


async def test_output_is_capped_keeping_head_and_tail(tmp_path, mode):
    result = await run("seq 1 300000", tmp_path, cap=1_000)
    assert result.truncated
    assert len(result.output) <= 1_000
    assert result.output.startswith("1\n2\n3\n")
    assert result.output.endswith("299999\n300000\n")
    assert "output cut" in result.output


async def test_reading_a_flood_of_output_keeps_memory_bounded(tmp_path):
    tracemalloc.start()
    try:
        result = await run("head -c 100000000 /dev/zero | tr '\\0' a; echo; echo END", tmp_path, cap=2_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert result.truncated and result.output.endswith("END\n")
    assert peak < 10_000_000


def test_bounded_output_never_holds_more_than_head_and_tail():
    output = BoundedOutput(max_chars=100)
    for _ in range(1_000):
        output.feed(b"x" * 10_000)
    assert output.total_bytes == 10_000_000
    assert output.held_bytes <= 2 * 4 * 100
    text, truncated = output.text()
    assert truncated and len(text) <= 100


def test_cap_text_leaves_short_text_alone():
    assert cap_text("short", 10) == ("short", False)
    capped, truncated = cap_text("a" * 50 + "b" * 50, 60)
    assert truncated and capped.startswith("a") and capped.endswith("b") and len(capped) <= 60


@needs_bubblewrap
async def test_network_is_cut_unless_allowed(tmp_path):
    with host_listener() as port:
        command = f"echo hello > /dev/tcp/127.0.0.1/{port} && echo connected"
        cut = await run(command, tmp_path)
        allowed = await run(command, tmp_path, allow_network=True)
    assert cut.exit_code != 0 and "connected" not in cut.output
    assert allowed.exit_code == 0 and "connected" in allowed.output


async def test_unisolated_mode_warns_loudly_and_runs_in_the_workspace(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(bubblewrap, "bubblewrap_path", lambda: None)
    bubblewrap.warn_unisolated_once.cache_clear()
    with caplog.at_level(logging.WARNING, logger="temporal_rollouts.sandbox_server.isolation.bubblewrap"):
        first = await run("pwd; echo $HOME", tmp_path)
        await run("true", tmp_path)
    warnings = [record for record in caplog.records if "UNISOLATED" in record.getMessage()]
    assert len(warnings) == 1
    assert first.output.splitlines() == [str(tmp_path), str(tmp_path)]


async def test_require_isolation_refuses_without_bubblewrap(tmp_path, monkeypatch):
    monkeypatch.setattr(bubblewrap, "bubblewrap_path", lambda: None)
    with pytest.raises(SandboxRequired):
        await run("touch ran", tmp_path, require_isolation=True)
    assert not (tmp_path / "ran").exists()


@needs_bubblewrap
async def test_a_read_only_command_cannot_change_the_workspace(tmp_path):
    """What a verifier's check runs with: no program it starts can write, rename, chmod or delete there."""
    (tmp_path / "kept.txt").write_text("as the agent left it\n")
    owner = own_confinement()
    for path in (tmp_path, tmp_path / "kept.txt"):  # the command's own files, as a slot's are
        os.chown(path, owner.uid(0), owner.gid(0))
    attempts = "; ".join(
        [
            "echo changed > kept.txt",
            "touch new.txt",
            "mv kept.txt moved.txt",
            "chmod 000 kept.txt",
            "rm kept.txt",
            "cat kept.txt",
        ]
    )
    done = await run(attempts, tmp_path, read_only=True)
    assert done.output.count("Read-only file system") == 5, done.output
    assert done.output.rstrip().endswith("as the agent left it")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.txt"] and (tmp_path / "kept.txt").stat().st_mode & 0o444


async def test_a_read_only_workspace_is_refused_unisolated(tmp_path, monkeypatch):
    """Nothing can make it read-only without bubblewrap: refused, never run as if it were."""
    monkeypatch.setattr(bubblewrap, "bubblewrap_path", lambda: None)
    with pytest.raises(SandboxRequired, match="read-only"):
        await run("touch ran", tmp_path, require_isolation=False, read_only=True)
    assert not (tmp_path / "ran").exists()
