"""LocalBackend's registry and restarts, and SandboxPool placing leases across real containers."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import time

import pytest

from temporal_rollouts.core.errors import SandboxUnreachable, SlotUnavailable
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, ReadFileOp
from tests.support.sandbox import ONE_CONTAINER, processes_running, root_of, runs_of, unique_sleep, wait_until


def process_gone(pid: int) -> bool:
    try:
        state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state == "Z"


async def test_started_container_is_registered_with_a_private_token(backend):
    info = await backend.start_container()
    registry = json.loads((backend.directory / "containers.json").read_text())
    assert [entry["container_id"] for entry in registry["containers"]] == [info.container_id]
    assert stat.S_IMODE(os.stat(info.token_file).st_mode) == 0o600
    assert info.read_token() not in json.dumps(registry)
    assert [known.container_id for known in await backend.list_containers()] == [info.container_id]
    assert "serving 2 slots" in (backend.container_dir(info.container_id) / "server.log").read_text()


@pytest.mark.slow
async def test_a_restarted_server_answers_stored_results_without_running_again(backend):
    info = await backend.start_container()
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        await pool.fleet.ensure_running()
        lease = await pool.acquire(Holder(workflow_id="survivor"), ttl_s=60, wait_s=1)
        command = ExecOp(command="echo ran >> side-effect.txt; wc -l < side-effect.txt")
        before = await pool.lease(lease).execute("before-crash", command)

        os.kill(info.pid, signal.SIGKILL)
        assert await wait_until(lambda: process_gone(info.pid))
        assert await backend.list_containers() == []
        assert backend.registry.get(info.container_id) is None

        restarted = await backend.start_container(container_id=info.container_id)
        assert restarted.url != info.url or restarted.pid != info.pid
        after = await pool.lease(lease).execute("before-crash", command)
        content = await pool.lease(lease).execute("after-crash", ReadFileOp(path="side-effect.txt"))
    assert after.replayed and after.output == before.output == "1\n"
    assert content.output == "ran\n"
    assert runs_of(root_of(backend, info.container_id), "before-crash") == 1


async def test_ensure_running_reuses_live_containers(backend):
    info = await backend.start_container()
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        live = await pool.fleet.ensure_running(min_containers=1)
        more = await pool.fleet.ensure_running(min_containers=2)
    assert [known.container_id for known in live] == [info.container_id]
    assert len(more) == 2 and more[0].container_id == info.container_id
    assert len(await backend.list_containers()) == 2


@pytest.mark.slow
async def test_pool_fills_free_slots_across_containers_then_waits(backend):
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        containers = await pool.fleet.ensure_running(min_containers=2)
        leases = [await pool.acquire(Holder(workflow_id=f"wf-{n}"), ttl_s=60, wait_s=1) for n in range(4)]
        placed = {(lease.container_id, lease.slot) for lease in leases}
        again = await pool.acquire(Holder(workflow_id="wf-0"), ttl_s=60, wait_s=0)
        with pytest.raises(SlotUnavailable):
            await pool.acquire(Holder(workflow_id="wf-late"), ttl_s=60, wait_s=0.3)
        outputs = [
            await pool.lease(lease).execute(f"where-{n}", ExecOp(command="pwd")) for n, lease in enumerate(leases)
        ]
        released = await pool.release(leases[0])
        late = await pool.acquire(Holder(workflow_id="wf-late"), ttl_s=60, wait_s=1)
        states = await pool.placement.look()
    assert len(placed) == 4 and {container_id for container_id, _ in placed} == {c.container_id for c in containers}
    assert again.lease_id == leases[0].lease_id
    assert all(output.ok and output.output == "/workspace\n" for output in outputs)
    assert released.released and (late.container_id, late.slot) == (leases[0].container_id, leases[0].slot)
    assert sum(state.lease is not None for slots in states.values() for state in slots) == 4


async def test_stopped_containers_are_unreachable_through_the_pool(backend):
    info = await backend.start_container()
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        await pool.fleet.ensure_running()
        lease = await pool.acquire(Holder(workflow_id="orphan"), ttl_s=60, wait_s=1)
        await backend.stop_container(info.container_id)
        with pytest.raises(SandboxUnreachable):
            await pool.lease(lease).execute("after-stop", ExecOp(command="true"))
    assert process_gone(info.pid)
    assert backend.registry.get(info.container_id) is None


async def test_client_reports_an_unreachable_server(backend):
    info = await backend.start_container()
    await backend.stop_container(info.container_id)
    async with SandboxClient(info.url, info.read_token(), timeout=2.0) as client:
        with pytest.raises(SandboxUnreachable):
            await client.send(HealthQuery())


async def test_stopping_a_container_ends_running_commands_promptly(backend):
    info = await backend.start_container()
    marker = unique_sleep()
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        await pool.fleet.ensure_running()
        lease = await pool.acquire(Holder(workflow_id="interrupted"), ttl_s=60, wait_s=1)
        sleep = ExecOp(command=f"sleep {marker}", timeout_s=120)
        running = asyncio.create_task(pool.lease(lease).execute("long", sleep))
        assert await wait_until(lambda: processes_running(marker) != [])
        started = time.monotonic()
        await backend.stop_container(info.container_id)
        with pytest.raises(SandboxUnreachable):
            await running
    assert time.monotonic() - started < 3
    assert process_gone(info.pid) and processes_running(marker) == []


async def test_pool_from_settings_describes_slots_and_may_refuse_to_start_containers(tmp_path):
    settings = Settings(data_dir=tmp_path / "data", sandbox={"slots_per_container": 2, "start_local": False})
    pool = SandboxPool.from_settings(settings)
    with pytest.raises(SandboxUnreachable):
        await pool.fleet.ensure_running()
    info = await pool.fleet.backend.start_container()
    try:
        assert [known.container_id for known in await pool.fleet.ensure_running()] == [info.container_id]
        lease = await pool.acquire(Holder(workflow_id="described"), ttl_s=60, wait_s=1)
        described = await pool.describe()
    finally:
        await pool.aclose()
        await pool.fleet.backend.stop_container(info.container_id)
    assert [(c.container_id, c.url) for c in described] == [(info.container_id, info.url)]
    assert [state.lease.lease_id if state.lease else None for state in described[0].slots] == [lease.lease_id, None]
