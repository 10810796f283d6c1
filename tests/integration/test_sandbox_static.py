"""The static backend over real sandbox server processes on two loopback addresses (two "hosts"),
each started as Kubernetes would: with its token, derived from the pool secret, in its environment."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from temporal_rollouts.core.errors import ConfigError, SandboxAuthError, SandboxError, SandboxUnreachable
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.static import StaticBackend
from temporal_rollouts.sandbox.backends.tokens import derive_token
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder
from tests.support.sandbox_process import SandboxProcess

SECRET = "static-pool-secret-for-tests-0123456789"


@pytest.fixture
def servers(tmp_path) -> Iterator[list[SandboxProcess]]:
    started = [
        SandboxProcess(tmp_path / cid, cid, derive_token(SECRET, cid), host=host).start()
        for cid, host in (("static-a", "127.0.0.2"), ("static-b", "127.0.0.3"))
    ]
    yield started
    for server in started:
        server.stop()


def static_settings(tmp_path, servers: list[SandboxProcess]) -> Settings:
    listed = [{"container_id": s.container_id, "url": s.url} for s in servers]
    return Settings(
        data_dir=tmp_path / "data",
        sandbox={
            "backend": {"type": "static", "servers": listed, "secret_env": "TEST_POOL_SECRET"},
            "slots_per_container": 2,
            "min_containers": 0,
            "max_containers": 2,
        },
    )


async def test_two_pools_share_the_configured_servers(tmp_path, servers, monkeypatch) -> None:
    monkeypatch.setenv("TEST_POOL_SECRET", SECRET)
    settings = static_settings(tmp_path, servers)
    async with SandboxPool.from_settings(settings) as host_a, SandboxPool.from_settings(settings) as host_b:
        assert isinstance(host_a.fleet.backend, StaticBackend) and not host_a.fleet.start_containers
        assert {info.container_id for info in await host_a.fleet.ensure_running()} == {"static-a", "static-b"}
        leases = [
            await pool.acquire(Holder(workflow_id=f"wf-{i}", run_id="r"), wait_s=5)
            for i, pool in enumerate([host_a, host_b, host_a, host_b])
        ]
        assert sorted((lease.container_id, lease.slot) for lease in leases) == [
            ("static-a", 0),
            ("static-a", 1),
            ("static-b", 0),
            ("static-b", 1),
        ]
        # A lease taken through one host's pool is served from the other's.
        out = await host_b.lease(leases[0]).execute("call-1", ExecOp(command="echo hello from $PWD"))
        assert out.exit_code == 0 and "hello" in out.output
        again = await host_a.lease(leases[0]).execute("call-1", ExecOp(command="echo hello from $PWD"))
        assert again.output == out.output
        for lease in leases:
            assert (await host_a.release(lease)).released
        assert not await host_b.leases()


async def test_a_restarted_server_keeps_its_leases_and_the_pool_never_starts_one(
    tmp_path, servers, monkeypatch
) -> None:
    monkeypatch.setenv("TEST_POOL_SECRET", SECRET)
    async with SandboxPool.from_settings(static_settings(tmp_path, servers)) as pool:
        lease = await pool.acquire(Holder(workflow_id="wf-keep", run_id="r"), wait_s=5)
        server = next(s for s in servers if s.container_id == lease.container_id)
        server.kill()
        with pytest.raises(SandboxUnreachable):
            await pool.lease(lease).execute("during", ExecOp(command="true"))
        with pytest.raises(SandboxError, match="cannot start"):
            await pool.fleet.backend.start_container()
        assert lease.container_id not in {info.container_id for info in await pool.fleet.refresh()}
        server.start()  # whoever runs it restarts it, on the same port and disk
        out = await pool.lease(lease).execute("after", ExecOp(command="echo back"))
        assert out.output.strip() == "back"
        assert (await pool.release(lease)).released


async def test_a_wrong_secret_is_refused_and_a_missing_one_explained(tmp_path, servers, monkeypatch) -> None:
    monkeypatch.setenv("TEST_POOL_SECRET", "a-different-secret-of-enough-length")
    async with SandboxPool.from_settings(static_settings(tmp_path, servers)) as pool:
        with pytest.raises(SandboxAuthError):
            await pool.acquire(Holder(workflow_id="wf-x", run_id="r"), wait_s=1)
    monkeypatch.delenv("TEST_POOL_SECRET")
    with pytest.raises(ConfigError, match=r"\$TEST_POOL_SECRET"):
        SandboxPool.from_settings(static_settings(tmp_path, servers))
