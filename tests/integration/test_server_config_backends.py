"""Every backend starts its sandbox servers with the pool's server options, as /health reports them.

The limits, the slot uid range and isolation used to reach only the local backend's servers; the
Nomad job and the Modal command started theirs with the server's built-in defaults. Here one set of
options that differs from every default goes through each backend that can run on this machine
(local processes; the fake Nomad agent's raw_exec tasks; the fake Modal's sandboxes, all of them
real sandbox server processes), and each server's /health must show exactly those options, a uid
of its own per slot drawn from the range, and an env's narrowing still lowering them for a lease.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator

import pytest

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.modal import ModalBackend
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.config import SlotLimits
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, NarrowRequest, SlotLimitsRequest
from tests.support import REPO
from tests.support.fake_modal import FakeModal
from tests.support.fake_nomad import FakeNomad
from tests.support.sandbox import needs_bubblewrap

pytestmark = needs_bubblewrap

SECRET = "server-config-pool-secret-0123456789"
LIMITS = SlotLimits(
    memory_limit_mb=300,
    max_processes=77,
    cpus=0.5,
    cpu_time_limit_s=123,
    file_size_limit_mb=45,
    tmp_limit_mb=33,
    disk_limit_mb=222,
)
UID_BASE, UID_COUNT = 63000, 100
AS_ROOT = os.geteuid() == 0


def settings_for(kind: str, tmp_path, address: str = "") -> Settings:
    backend: dict = {"type": kind}
    if kind == "nomad":
        backend |= {
            "address": address,
            "secret_env": "TEST_POOL_SECRET",
            "python": sys.executable,
            "pythonpath": str(REPO),
            "job_prefix": "cfg",
            "start_timeout_s": 30,
        }
    elif kind == "modal":
        backend |= {"app_name": "cfg", "secret_env": "TEST_POOL_SECRET", "start_timeout_s": 30}
    return Settings(
        data_dir=tmp_path / "data",
        sandbox={
            "backend": backend,
            "slots_per_container": 2,
            "min_containers": 2,
            "max_containers": 2,
            "lease_ttl_s": 60,
            "limits": LIMITS.model_dump(),
            "slot_uid_base": UID_BASE,
            "slot_uid_count": UID_COUNT,
            "max_output_chars": 777,
            "use_cgroups": False,
        },
    )


@pytest.fixture(params=["local", "nomad", "modal"])
async def pool(request, tmp_path, monkeypatch) -> AsyncIterator[SandboxPool]:
    monkeypatch.setenv("TEST_POOL_SECRET", SECRET)
    kind = request.param
    if kind == "local":
        made = SandboxPool.from_settings(settings_for(kind, tmp_path))
        async with made:
            yield made
        await made.fleet.backend.shutdown()
    elif kind == "nomad":
        fake = FakeNomad(tmp_path / "nomad").start()
        try:
            async with SandboxPool.from_settings(settings_for(kind, tmp_path, fake.address)) as made:
                yield made
        finally:
            fake.stop()
    else:
        fake = FakeModal(tmp_path / "modal")
        settings = settings_for(kind, tmp_path)
        try:
            async with SandboxPool.from_settings(
                settings, ModalBackend.from_settings(settings, modal_api=fake)
            ) as made:
                yield made
        finally:
            fake.close()


async def test_each_backends_servers_run_the_configured_options(pool: SandboxPool):
    containers = await pool.fleet.ensure_running()
    assert len(containers) == 2
    claimed: list[int] = []
    for info in containers:
        health = await pool.fleet.send(info.container_id, HealthQuery())
        assert health.slot_limits == LIMITS
        assert health.require_isolation and health.isolation == "bubblewrap"
        assert health.limits["memory"].startswith("watchdog"), "--no-cgroups reached the server"
        assert health.limits["cpus"].startswith("watchdog")
        if AS_ROOT:
            assert health.uid_range == (UID_BASE, UID_BASE + UID_COUNT - 1)
            assert sorted(health.slot_uids) == [0, 1] and all(
                UID_BASE <= u < UID_BASE + UID_COUNT for u in health.slot_uids.values()
            )
            claimed += health.slot_uids.values()
    assert len(claimed) == len(set(claimed)), f"two slots of one host share a uid: {claimed}"

    lease = await pool.acquire(Holder(workflow_id="config-check", run_id="r"), wait_s=10)
    slot = pool.lease(lease)
    cut = await slot.execute("long", ExecOp(command="head -c 5000 /dev/zero | tr '\\0' x"))
    assert cut.truncated and len(cut.output) <= 777, "max_output_chars reached the server"
    narrowed = await pool.fleet.send(
        lease.container_id,
        NarrowRequest(
            slot=lease.slot, lease_id=lease.lease_id, limits=SlotLimitsRequest(memory_limit_mb=100, disk_limit_mb=500)
        ),
    )
    assert (narrowed.memory_limit_mb, narrowed.disk_limit_mb) == (100, 222), "an env narrows, never widens"
    if AS_ROOT:
        whoami = await slot.execute("id", ExecOp(command="id -u"))
        assert int(whoami.output) in claimed
    await pool.release(lease)
