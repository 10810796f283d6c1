"""A sandbox server that dies: restarted in place with its leases and workspaces, or given up on and reported."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time

import pytest

from temporal_rollouts.core.settings import PoolOptions
from temporal_rollouts.core.errors import SandboxUnreachable
from temporal_rollouts.sandbox.backends.local import HEALTH_TIMEOUT_S, LocalBackend
from temporal_rollouts.sandbox.backends.registry import ContainerRegistry, RegistryBusy
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import ExecOp, ReadFileOp, WriteFileOp
from tests.support.processes import command_lines
from tests.support.sandbox import (
    holder,
    ONE_CONTAINER,
    REPO,
    root_of,
    runs_of,
    sandbox_settings,
    wait_until,
    workspace_of,
)


def kill_server(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def gone(pid: int) -> bool:
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def server_starts(backend: LocalBackend, container_id: str) -> int:
    return (backend.container_dir(container_id) / "server.log").read_text().count("serving 2 slots")


@pytest.mark.slow
async def test_a_killed_server_is_restarted_in_place_by_the_next_request_and_by_check_health(backend, tmp_path):
    async with (
        SandboxPool(backend, ONE_CONTAINER) as pool,
        SandboxPool(
            LocalBackend(tmp_path / "data", sandbox_settings(slots_per_container=2)), ONE_CONTAINER
        ) as other_pool,
    ):
        (info,) = await pool.fleet.ensure_running()
        lease = await pool.acquire(holder("survivor"), ttl_s=60, wait_s=0)
        await pool.lease(lease).execute("write", WriteFileOp(path="notes.txt", content="kept"))
        counted = await pool.lease(lease).execute("count", ExecOp(command="echo x >> runs; wc -l < runs"))

        kill_server(info.pid)
        assert await wait_until(lambda: gone(info.pid))
        read, again = await asyncio.gather(
            pool.lease(lease).execute("read", ReadFileOp(path="notes.txt")),
            other_pool.lease(lease).execute("count", ExecOp(command="echo x >> runs; wc -l < runs")),
        )
        restarted = backend.registry.get(info.container_id)
        assert read.output == "kept" and again.replayed and again.output == counted.output == "1\n"
        assert restarted is not None and restarted.pid != info.pid
        assert server_starts(backend, info.container_id) == 2

        kill_server(restarted.pid)
        assert await wait_until(lambda: gone(restarted.pid))
        report = await pool.fleet.check_health()
        renewed = await pool.lease(lease).renew(ttl_s=60)
        states = await pool.placement.look()
    assert report.restarted == [info.container_id] and report.healthy == [info.container_id]
    assert report.removed == [] and report.lost_leases == []
    assert renewed.lease_id == lease.lease_id
    assert [state.lease.lease_id if state.lease else None for state in states[info.container_id]][lease.slot] == (
        lease.lease_id
    )
    assert (workspace_of(backend, info.container_id, lease.slot) / "notes.txt").read_text() == "kept"
    assert runs_of(root_of(backend, info.container_id), "count") == 1


async def test_a_container_that_cannot_restart_is_removed_and_its_leases_reported(backend):
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        (info,) = await pool.fleet.ensure_running()
        lease = await pool.acquire(holder("stranded"), ttl_s=60, wait_s=0)
        kill_server(info.pid)
        assert await wait_until(lambda: gone(info.pid))
        info.token_file.unlink()
        info.token_file.mkdir()  # the server cannot read its token, so it cannot start again
        report = await pool.fleet.check_health()
        with pytest.raises(SandboxUnreachable):
            await pool.lease(lease).execute("after", ExecOp(command="true"))
    assert report.removed == [info.container_id] and report.restarted == []
    assert [lost.lease_id for lost in report.lost_leases] == [lease.lease_id]
    assert backend.registry.find(info.container_id) is None


@pytest.mark.slow
async def test_a_hung_server_surfaces_as_unreachable_instead_of_hanging(backend):
    async with SandboxPool(backend, PoolOptions(max_containers=1, request_timeout_s=1.0)) as pool:
        (info,) = await pool.fleet.ensure_running()
        lease = await pool.acquire(holder("patient"), ttl_s=60, wait_s=0)
        os.kill(info.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(SandboxUnreachable):
                await pool.lease(lease).renew(ttl_s=60)
            waited = time.monotonic() - started
        finally:
            os.kill(info.pid, signal.SIGCONT)
        output = await pool.lease(lease).execute("thawed", ExecOp(command="echo back"))
    assert waited < 1.0 + HEALTH_TIMEOUT_S + 2.0
    assert output.output == "back\n" and backend.registry.get(info.container_id) == info


async def test_a_container_restarted_while_judged_dead_is_not_marked_dead(tmp_path):
    """The race CI once hit: a listing judged the killed process dead, another task restarted
    the container in place meanwhile, and the late verdict moved the new process to the dead
    list, where nothing would ever restart it. Only the judged entry may move."""
    from temporal_rollouts.sandbox.backends.base import ContainerInfo

    registry = ContainerRegistry(tmp_path / "containers.json")
    old = ContainerInfo(
        container_id="local-x",
        url="http://127.0.0.1:1",
        pid=11,
        backend="local",
        token_file=tmp_path / "token",
        started_at=1.0,
    )
    await registry.upsert(old)
    judged_dead = registry.load()
    restarted = old.model_copy(update={"pid": 12, "url": "http://127.0.0.1:2", "started_at": 2.0})
    await registry.upsert(restarted)
    await registry.mark_dead(judged_dead)
    assert registry.load() == [restarted] and registry.dead() == []
    await registry.mark_dead(registry.load())
    assert registry.load() == [] and registry.dead() == [restarted]


async def test_the_registry_lock_excludes_other_processes(tmp_path):
    registry = ContainerRegistry(tmp_path / "containers.json", lock_timeout_s=0.3)
    holder_script = (
        "import fcntl, sys, time\n"
        "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX); print('locked', flush=True); time.sleep(1.0)\n"
    )
    other = subprocess.Popen(
        [sys.executable, "-c", holder_script, str(registry.lock_path)], cwd=REPO, stdout=subprocess.PIPE
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == b"locked"
        with pytest.raises(RegistryBusy):
            async with registry.locked():
                pass
        registry.lock_timeout_s = 5.0
        started = time.monotonic()
        async with registry.locked():
            async with registry.locked():  # reentrant within the task that holds it
                waited = time.monotonic() - started
    finally:
        other.wait(5)
    assert 0.2 < waited < 2.0


async def test_a_server_whose_starter_died_before_registering_it_is_stopped(backend):
    registered = await backend.start_container()
    orphan = await backend._launch("local-orphan", None)  # started, but the starter "died" before registering it
    assert [info.container_id for info in await backend.list_containers()] == [registered.container_id]
    assert await wait_until(lambda: gone(orphan.pid))
    assert not gone(registered.pid)


async def test_a_start_given_up_before_the_server_is_ready_stops_the_server(backend):
    """Ctrl-C in `rollouts demo` while its sandbox was starting left a server nobody had registered."""
    starting = asyncio.create_task(backend.start_container("local-given-up"))
    assert await wait_until(lambda: server_pids(backend, "local-given-up"), timeout_s=30, interval_s=0.01)
    spawned = server_pids(backend, "local-given-up")  # started, not ready yet: nothing registered it
    starting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await starting
    assert await wait_until(lambda: all(gone(pid) for pid in spawned))
    assert await backend.list_containers() == []


def server_pids(backend: LocalBackend, container_id: str) -> list[int]:
    """The sandbox servers running from the container's folder, found by their command line."""
    folder = str(backend.container_dir(container_id))
    return [pid for pid, line in command_lines().items() if folder in line]
