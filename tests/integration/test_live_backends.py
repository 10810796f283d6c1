"""Live tests against a real Nomad cluster or a real Modal account; skipped without credentials.

Nomad runs when NOMAD_ADDR is set (NOMAD_TOKEN too when ACLs are on). Its client nodes need the
raw_exec driver and a Python that can import the sandbox server: set ROLLOUTS_LIVE_NOMAD_PYTHON
(default python3) and ROLLOUTS_LIVE_NOMAD_PYTHONPATH (a folder on the nodes holding this
repository), and the allocations' addresses must be reachable from here. Modal runs when
MODAL_TOKEN_ID and MODAL_TOKEN_SECRET are set; it creates sandboxes in app
`rollouts-live-test-<random>` and costs a few cents.

Each test: start; race two starts on one name; acquire from two pools; kill the server and see
the pool recover; reap; and at the end remove everything by tag (also when the test fails).

The item-image tests build a small Dockerfile (Debian with jq) and run a command on a slot of it:
on Modal, Modal builds it; on Nomad (ROLLOUTS_LIVE_REGISTRY set to a registry the client nodes pull
from, the docker driver on them, podman and buildah here) this worker builds it, adds the server's
layer and pushes it.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import uuid
from collections.abc import AsyncIterator, Callable

import pytest

from temporal_rollouts.core.errors import LeaseLost, RolloutError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, SlotLease

pytestmark = pytest.mark.cloud

SECRET_ENV = "ROLLOUTS_LIVE_POOL_SECRET"


def live_settings(backend: dict) -> Settings:
    return Settings(
        sandbox={
            "backend": {**backend, "secret_env": SECRET_ENV},
            "slots_per_container": 2,
            "min_containers": 1,
            "max_containers": 2,
            "lease_ttl_s": 600,
        }
    )


@pytest.fixture
def pool_secret(monkeypatch) -> None:
    monkeypatch.setenv(SECRET_ENV, secrets.token_hex(32))


@pytest.fixture
async def nomad_settings(pool_secret) -> AsyncIterator[Settings]:
    if not os.environ.get("NOMAD_ADDR"):
        pytest.skip("NOMAD_ADDR is not set: no Nomad cluster to test against")
    settings = live_settings(
        {
            "type": "nomad",
            "address": os.environ["NOMAD_ADDR"],
            "token_env": "NOMAD_TOKEN",
            "job_prefix": f"rollouts-live-{uuid.uuid4().hex[:6]}",
            "start_timeout_s": 300,
            "python": os.environ.get("ROLLOUTS_LIVE_NOMAD_PYTHON", "python3"),
            "pythonpath": os.environ.get("ROLLOUTS_LIVE_NOMAD_PYTHONPATH"),
        }
    )
    yield settings
    async with SandboxPool.from_settings(settings) as pool:
        await pool.fleet.backend.shutdown(purge=True)


@pytest.fixture
async def modal_settings(pool_secret) -> AsyncIterator[Settings]:
    if not (os.environ.get("MODAL_TOKEN_ID") and os.environ.get("MODAL_TOKEN_SECRET")):
        pytest.skip("MODAL_TOKEN_ID/MODAL_TOKEN_SECRET are not set: no Modal account to test against")
    settings = live_settings(
        {
            "type": "modal",
            "app_name": f"rollouts-live-test-{uuid.uuid4().hex[:6]}",
            "start_timeout_s": 600,
            "max_lifetime_s": 1800,
            "idle_timeout_s": 900,
        }
    )
    yield settings
    async with SandboxPool.from_settings(settings) as pool:
        await pool.fleet.backend.shutdown()
        assert await pool.fleet.backend.list_containers() == []


async def kill_nomad_server(pool: SandboxPool, container_id: str) -> None:
    backend = pool.fleet.backend
    allocs = await asyncio.to_thread(backend._client.job.get_allocations, container_id)
    running = next(a for a in allocs if a["ClientStatus"] == "running")
    await asyncio.to_thread(backend._client.client.allocation.signal_allocation, running["ID"], "SIGKILL")


async def kill_modal_server(pool: SandboxPool, container_id: str) -> None:
    sandbox = await pool.fleet.backend._by_name(container_id)
    process = await sandbox.exec.aio("pkill", "-KILL", "-f", "temporal_rollouts.sandbox_server")
    await process.wait.aio()


async def exercise(settings: Settings, kill: Callable[[SandboxPool, str], object], keeps_leases: bool) -> None:
    async with SandboxPool.from_settings(settings) as pool_a, SandboxPool.from_settings(settings) as pool_b:
        backend_a, backend_b = pool_a.fleet.backend, pool_b.fleet.backend
        await backend_a.prepare()
        name = backend_a.container_name(0) if hasattr(backend_a, "container_name") else backend_a.job_id(0)
        started = await asyncio.gather(backend_a.start_container(name), backend_b.start_container(name))
        assert {info.container_id for info in started} == {name}
        a = await pool_a.acquire(Holder(workflow_id="live-a", run_id="r"), wait_s=120)
        b = await pool_b.acquire(Holder(workflow_id="live-b", run_id="r"), wait_s=120)
        assert (a.container_id, a.slot) != (b.container_id, b.slot)
        out = await pool_b.lease(a).execute("c1", ExecOp(command="true && echo live"))
        assert out.output.strip() == "live"
        await kill(pool_a, a.container_id)
        deadline = asyncio.get_running_loop().time() + 300
        while True:
            try:
                again = await pool_a.lease(a).execute("c1", ExecOp(command="true && echo live"))
                assert keeps_leases and again.output == out.output
                break
            except RolloutError as err:
                if isinstance(err, LeaseLost) and not keeps_leases:
                    break  # a sandbox of the same name came back, without the old one's leases
                if asyncio.get_running_loop().time() > deadline:
                    raise
                if not keeps_leases and not any(i.container_id == a.container_id for i in await pool_a.fleet.refresh()):
                    break
                await asyncio.sleep(2)
        fresh = await pool_a.acquire(Holder(workflow_id="live-c", run_id="r"), wait_s=300)

        async def closed(holder: Holder) -> bool:
            return True

        reaped: list[SlotLease] = await pool_b.reap(closed)
        assert fresh.lease_id in {lease.lease_id for lease in reaped}
        assert not await pool_b.leases()


async def test_nomad_live(nomad_settings) -> None:
    await exercise(nomad_settings, kill_nomad_server, keeps_leases=True)


async def test_modal_live(modal_settings) -> None:
    await exercise(modal_settings, kill_modal_server, keeps_leases=False)


JQ_DOCKERFILE = (
    "FROM debian:bookworm-slim\n"
    "RUN apt-get update && apt-get install -y --no-install-recommends jq && rm -rf /var/lib/apt/lists/*\n"
    "WORKDIR /workspace\n"
)


async def exercise_item_image(settings: Settings, tmp_path) -> None:
    from temporal_rollouts.core.images import ImageSpec

    context = tmp_path / "jq-task"
    context.mkdir()
    (context / "Dockerfile").write_text(JQ_DOCKERFILE)
    async with SandboxPool.from_settings(settings) as pool:
        await pool.fleet.backend.prepare()
        image = await pool.build_image(ImageSpec(context=str(context), name="jq-task"), "the live test")
        again = await pool.build_image(ImageSpec(context=str(context), name="jq-task"), "the live test")
        assert again.remote == image.remote and not again.built
        lease = await pool.acquire(Holder(workflow_id="live-image", run_id="r"), wait_s=600, image=image)
        out = await pool.lease(lease).execute("c1", ExecOp(command="jq --version"))
        assert out.ok and out.output.startswith("jq-"), out.output
        assert [c.image for c in await pool.describe() if c.container_id == lease.container_id] == [image.name]
        await pool.release(lease)


async def test_modal_live_item_image(modal_settings, tmp_path) -> None:
    await exercise_item_image(modal_settings, tmp_path)


async def test_nomad_live_item_image(nomad_settings, tmp_path) -> None:
    registry = os.environ.get("ROLLOUTS_LIVE_REGISTRY")
    if not registry:
        pytest.skip("ROLLOUTS_LIVE_REGISTRY is not set: no registry the Nomad clients pull from")
    backend = {**nomad_settings.sandbox.backend.model_dump(), "driver": "docker"}
    settings = nomad_settings.model_copy(
        update={
            "sandbox": nomad_settings.sandbox.model_copy(
                update={"backend": type(nomad_settings.sandbox.backend)(**backend)}
            ),
            "images": nomad_settings.images.model_copy(update={"registry": registry}),
        }
    )
    await exercise_item_image(settings, tmp_path)
