"""The Nomad backend through the real python-nomad client, against tests/support/fake_nomad.py: a fake
Nomad agent (no Nomad binary can run here) that runs raw_exec tasks as real sandbox server processes."""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from temporal_rollouts.core.errors import ConfigError, LeaseLost, SandboxUnreachable
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.nomad import NomadBackend
from temporal_rollouts.sandbox.backends.tokens import derive_token
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, ToolOutput
from tests.support import REPO
from tests.support.fake_nomad import FakeNomad

SECRET = "nomad-pool-secret-for-tests-0123456789"
ACL = "acl-token-0000-1111"


@pytest.fixture
def fake_nomad(tmp_path, monkeypatch) -> Iterator[FakeNomad]:
    monkeypatch.setenv("TEST_POOL_SECRET", SECRET)
    monkeypatch.setenv("TEST_NOMAD_TOKEN", ACL)
    fake = FakeNomad(tmp_path / "nomad", acl_token=ACL).start()
    yield fake
    fake.stop()


def nomad_settings(tmp_path, fake: FakeNomad, **backend: object) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        sandbox={
            "backend": {
                "type": "nomad",
                "address": fake.address,
                "token_env": "TEST_NOMAD_TOKEN",
                "secret_env": "TEST_POOL_SECRET",
                "python": sys.executable,
                "pythonpath": str(REPO),
                "job_prefix": "sbx",
                "start_timeout_s": 30,
                **backend,
            },
            "slots_per_container": 2,
            "min_containers": 1,
            "max_containers": 2,
        },
    )


@pytest.fixture
async def pool(tmp_path, fake_nomad) -> AsyncIterator[SandboxPool]:
    async with SandboxPool.from_settings(nomad_settings(tmp_path, fake_nomad)) as made:
        yield made


async def eventually(call, timeout_s: float = 20.0) -> ToolOutput:
    """Retry a slot call as Temporal would retry its activity while a server restarts."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return await call()
        except SandboxUnreachable:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


async def test_scale_up_and_down_with_tokens_kept_out_of_job_specs(pool, fake_nomad) -> None:
    assert isinstance(pool.fleet.backend, NomadBackend)
    assert [info.container_id for info in await pool.fleet.ensure_running()] == ["sbx-0"]
    leases = [await pool.acquire(Holder(workflow_id=f"wf-{i}", run_id="r"), wait_s=10) for i in range(3)]
    assert sorted(lease.container_id for lease in leases) == ["sbx-0", "sbx-0", "sbx-1"]
    out = await pool.lease(leases[2]).execute("c1", ExecOp(command="true && echo ok"))
    assert (out.exit_code, out.output.strip()) == (0, "ok")
    token = derive_token(SECRET, "sbx-1")
    assert token not in json.dumps([job.spec for job in fake_nomad.jobs.values()])
    assert fake_nomad.variables[("default", "nomad/jobs/sbx-1")]["Items"]["token"] == token
    for lease in leases:
        await pool.release(lease)
    assert await pool.fleet.scale_down(min_containers=1, idle_s=0) in (["sbx-0"], ["sbx-1"])
    assert len(fake_nomad.jobs) == 1 and len(await pool.fleet.refresh()) == 1


async def test_a_killed_task_restarts_in_its_allocation_and_keeps_leases_and_results(pool, fake_nomad) -> None:
    await pool.fleet.ensure_running()
    lease = await pool.acquire(Holder(workflow_id="wf-kill", run_id="r"), wait_s=10)
    first = await pool.lease(lease).execute("c1", ExecOp(command="echo $RANDOM$RANDOM > n; cat n"))
    alloc_before = fake_nomad.alloc_of(lease.container_id).id
    pid = fake_nomad.kill_task(lease.container_id)
    again = await eventually(lambda: pool.lease(lease).execute("c1", ExecOp(command="echo $RANDOM$RANDOM > n; cat n")))
    assert again.output == first.output  # answered from its stored result, not run twice
    assert (await pool.lease(lease).execute("c2", ExecOp(command="cat n"))).output == first.output
    assert fake_nomad.alloc_of(lease.container_id).id == alloc_before
    assert fake_nomad.running_processes(lease.container_id)[0].pid != pid
    assert (await pool.release(lease)).released


async def test_a_lost_allocation_moves_and_the_pool_follows(pool, fake_nomad) -> None:
    await pool.fleet.ensure_running()
    lease = await pool.acquire(Holder(workflow_id="wf-lost", run_id="r"), wait_s=10)
    url_before = (await pool.fleet.client(lease.container_id)).base_url
    fake_nomad.lose_allocation(lease.container_id)
    with pytest.raises(LeaseLost):  # the node's disk went with it: the lease is gone, and said so
        await eventually(lambda: pool.lease(lease).execute("c1", ExecOp(command="true")))
    assert (await pool.fleet.client(lease.container_id)).base_url != url_before
    fresh = await pool.acquire(Holder(workflow_id="wf-lost-2", run_id="r"), wait_s=10)
    assert (await pool.lease(fresh).execute("c1", ExecOp(command="echo moved"))).output.strip() == "moved"


async def test_two_pools_racing_never_start_one_index_twice(tmp_path, fake_nomad) -> None:
    settings = nomad_settings(tmp_path, fake_nomad)
    async with SandboxPool.from_settings(settings) as pool_a, SandboxPool.from_settings(settings) as pool_b:
        started = await asyncio.gather(pool_a.fleet.backend.start_container(), pool_b.fleet.backend.start_container())
        assert {info.container_id for info in started} == {"sbx-0"}
        holders = [Holder(workflow_id=f"race-{i}", run_id="r") for i in range(4)]
        leases = await asyncio.gather(*(p.acquire(h, wait_s=20) for p, h in zip([pool_a, pool_b] * 2, holders)))
        assert len({(lease.container_id, lease.slot) for lease in leases}) == 4
    assert sorted(job_id for _, job_id in fake_nomad.jobs) == ["sbx-0", "sbx-1"]
    assert all(job.version == 0 for job in fake_nomad.jobs.values())  # each registered once
    assert all(len(fake_nomad.running_processes(job_id)) == 1 for _, job_id in fake_nomad.jobs)


async def test_a_bad_acl_token_is_a_clear_configuration_error(tmp_path, fake_nomad, monkeypatch) -> None:
    monkeypatch.setenv("TEST_NOMAD_TOKEN", "wrong")
    async with SandboxPool.from_settings(nomad_settings(tmp_path, fake_nomad)) as pool:
        with pytest.raises(ConfigError, match=r"refused the ACL token \(from \$TEST_NOMAD_TOKEN\)"):
            await pool.fleet.backend.prepare()
    assert not fake_nomad.jobs


async def test_shutdown_purges_and_purge_on_start_clears_stuck_jobs(tmp_path, fake_nomad) -> None:
    settings = nomad_settings(tmp_path, fake_nomad, purge_job_on_start=True)
    async with SandboxPool.from_settings(settings) as pool:
        await pool.fleet.ensure_running(2)
        fake_nomad.break_task("sbx-1")  # stuck: restarting, never running
        await asyncio.sleep(0.5)
        assert await pool.fleet.backend.container_state("sbx-1") == "unresponsive"
        await pool.fleet.backend.prepare()
        assert sorted(job_id for _, job_id in fake_nomad.jobs) == ["sbx-0"]
        assert await pool.fleet.backend.shutdown() == ["sbx-0"]
    assert not fake_nomad.jobs


@pytest.mark.slow
async def test_a_dead_job_is_registered_again_by_one_worker(tmp_path, fake_nomad) -> None:
    settings = nomad_settings(tmp_path, fake_nomad)
    async with SandboxPool.from_settings(settings) as pool_a, SandboxPool.from_settings(settings) as pool_b:
        await pool_a.fleet.ensure_running()
        fake_nomad.break_task("sbx-0")  # every restart and reschedule fails: Nomad gives the job up

        async def dead() -> bool:
            return await pool_a.fleet.backend.container_state("sbx-0") == "dead"

        deadline = time.monotonic() + 30
        while not await dead():
            assert time.monotonic() < deadline, "the job never died"
            await asyncio.sleep(0.2)
        assert [info.container_id for info in await pool_a.fleet.backend.dead_containers()] == ["sbx-0"]
        reports = await asyncio.gather(pool_a.fleet.check_health(), pool_b.fleet.check_health())
        assert all(report.healthy == ["sbx-0"] for report in reports)
        assert fake_nomad.jobs[("default", "sbx-0")].version == 1  # registered again once, not twice
        lease = await pool_b.acquire(Holder(workflow_id="after-death", run_id="r"), wait_s=10)
        assert (await pool_a.lease(lease).execute("c1", ExecOp(command="echo back"))).output.strip() == "back"
