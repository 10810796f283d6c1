"""The Modal backend against tests/support/fake_modal.py: the modal client's surface, faked (no Modal
account here), running each sandbox as a real local sandbox server process and raising the real
`modal.exception` types; every call it receives is bound to the installed modal's signatures."""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator

import modal
import pytest

from temporal_rollouts.core.errors import SandboxUnreachable
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.modal import ModalBackend
from temporal_rollouts.sandbox.backends.tokens import derive_token
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder
from tests.support.fake_modal import FakeModal

SECRET = "modal-pool-secret-for-tests-0123456789"


def modal_settings(tmp_path, **backend: object) -> Settings:
    return Settings(
        data_dir=tmp_path / "data",
        sandbox={
            "backend": {
                "type": "modal",
                "app_name": "rl-test",
                "secret_env": "TEST_POOL_SECRET",
                "start_timeout_s": 30,
                "env_vars": {"FOO": "bar"},
                **backend,
            },
            "slots_per_container": 2,
            "min_containers": 1,
            "max_containers": 2,
            "lease_ttl_s": 60,
        },
    )


@pytest.fixture
def fake_modal(tmp_path, monkeypatch):
    monkeypatch.setenv("TEST_POOL_SECRET", SECRET)
    fake = FakeModal(tmp_path / "modal")
    yield fake
    fake.close()


def modal_pool(settings: Settings, fake: FakeModal) -> SandboxPool:
    return SandboxPool.from_settings(settings, backend=ModalBackend.from_settings(settings, modal_api=fake))


@pytest.fixture
async def pool(tmp_path, fake_modal) -> AsyncIterator[SandboxPool]:
    async with modal_pool(modal_settings(tmp_path), fake_modal) as made:
        yield made


async def test_sandboxes_serve_slots_with_the_token_as_a_modal_secret(pool, fake_modal) -> None:
    await pool.fleet.ensure_running()
    leases = [await pool.acquire(Holder(workflow_id=f"wf-{i}", run_id="r"), wait_s=10) for i in range(3)]
    assert sorted(lease.container_id for lease in leases) == ["rl-test-0", "rl-test-0", "rl-test-1"]
    out = await pool.lease(leases[0]).execute("c1", ExecOp(command="true && echo ok"))
    assert out.output.strip() == "ok"
    create = next(kwargs for name, _, kwargs in fake_modal.calls if name == "Sandbox.create")
    assert create["idle_timeout"] > 60 and create["encrypted_ports"] == [8080] and create["env"]["FOO"] == "bar"
    token = derive_token(SECRET, "rl-test-0")
    assert token not in repr([args for name, args, _ in fake_modal.calls if name == "Sandbox.create"])
    assert any(name == "Secret.from_dict" and args == ({"SANDBOX_TOKEN": token},) for name, args, _ in fake_modal.calls)
    for lease in leases:
        await pool.release(lease)


async def test_two_workers_racing_start_one_named_sandbox(tmp_path, fake_modal) -> None:
    settings = modal_settings(tmp_path)
    async with modal_pool(settings, fake_modal) as pool_a, modal_pool(settings, fake_modal) as pool_b:
        both_want = [pool.fleet.backend.start_container("rl-test-0") for pool in (pool_a, pool_b)]
        started = await asyncio.gather(*both_want)
        assert {info.container_id for info in started} == {"rl-test-0"}
        assert len(fake_modal.running()) == 1
        assert fake_modal.call_names().count("Sandbox.create") == 2  # the second was refused by name
        a = await pool_a.acquire(Holder(workflow_id="a", run_id="r"), wait_s=10)
        b = await pool_b.acquire(Holder(workflow_id="b", run_id="r"), wait_s=10)
        assert (a.container_id, b.container_id) == ("rl-test-0", "rl-test-0") and a.slot != b.slot
        assert (await pool_b.lease(a).execute("x", ExecOp(command="echo across"))).output.strip() == "across"


async def test_a_killed_server_ends_its_sandbox_and_the_pool_starts_another(pool, fake_modal) -> None:
    await pool.fleet.ensure_running()
    lease = await pool.acquire(Holder(workflow_id="wf-k", run_id="r"), wait_s=10)
    fake_modal.by_name(lease.container_id).process.kill()
    with pytest.raises(SandboxUnreachable):
        await pool.lease(lease).execute("c1", ExecOp(command="true"))
    fresh = await pool.acquire(Holder(workflow_id="wf-k2", run_id="r"), wait_s=15)
    assert (await pool.lease(fresh).execute("c1", ExecOp(command="echo again"))).output.strip() == "again"


async def test_a_killed_sandbox_still_listed_is_not_waited_on_as_one_starting(pool, fake_modal) -> None:
    """A sandbox whose server was killed stays listed for a moment until Modal marks it finished. A pool that
    needs one more took it for another worker's start and failed the acquire with "exited while starting" (seen
    in CI on a loaded host, where the fake's own window is that moment): it starts a new one instead."""
    await pool.fleet.ensure_running()
    lease = await pool.acquire(Holder(workflow_id="wf-k", run_id="r"), wait_s=10)
    killed = fake_modal.by_name(lease.container_id)
    killed.listed_after_exit = True
    killed.process.kill()
    killed.process.wait()
    with pytest.raises(SandboxUnreachable):
        await pool.lease(lease).execute("c1", ExecOp(command="true"))
    fresh = await pool.acquire(Holder(workflow_id="wf-k2", run_id="r"), wait_s=15)
    assert fresh.container_id != killed.name
    assert (await pool.lease(fresh).execute("c1", ExecOp(command="echo again"))).output.strip() == "again"


@pytest.mark.slow
async def test_a_sandbox_near_its_lifetime_drains_and_is_replaced(tmp_path, fake_modal) -> None:
    settings = modal_settings(tmp_path, max_lifetime_s=120, drain_margin_s=116)
    async with modal_pool(settings, fake_modal) as pool:
        await pool.fleet.ensure_running()
        held = await pool.acquire(Holder(workflow_id="old", run_id="r"), wait_s=15)
        while any(info.accepting for info in await pool.fleet.refresh() if info.container_id == held.container_id):
            await asyncio.sleep(0.2)  # until it is within the drain margin of its lifetime
        newcomer = await pool.acquire(Holder(workflow_id="new", run_id="r"), wait_s=15)
        assert newcomer.container_id != held.container_id  # no new lease goes to a draining sandbox
        assert (await pool.lease(held).execute("c1", ExecOp(command="echo still"))).output.strip() == "still"
        assert held.container_id not in await pool.fleet.scale_down()  # its holder finishes first
        await pool.release(held)
        assert held.container_id in await pool.fleet.scale_down()
        assert held.container_id not in {s.name for s in fake_modal.running()}


async def test_a_sandbox_whose_tunnel_is_not_open_yet_does_not_hold_up_listing(pool, fake_modal) -> None:
    await pool.fleet.ensure_running()
    fake_modal.tunnel_error = fake_modal.exception.SandboxTimeoutError("tunnels are not available yet")
    try:
        started = asyncio.ensure_future(pool.fleet.backend.start_container("rl-test-1"))
        await asyncio.sleep(1.0)
        assert [info.container_id for info in await pool.fleet.refresh()] == ["rl-test-0"]  # seen before, cached
    finally:
        fake_modal.tunnel_error = None
    assert (await started).container_id == "rl-test-1"
    assert sorted(info.container_id for info in await pool.fleet.refresh()) == ["rl-test-0", "rl-test-1"]


async def test_shutdown_removes_every_sandbox_by_tag(pool, fake_modal) -> None:
    await pool.fleet.ensure_running(2)
    assert sorted(await pool.fleet.backend.shutdown()) == ["rl-test-0", "rl-test-1"]
    assert fake_modal.running() == []


def test_every_modal_call_the_backend_makes_binds_to_the_installed_signatures(tmp_path, fake_modal) -> None:
    """Independent of the fake: the keywords of the one create call, against modal.Sandbox.create itself."""
    backend = ModalBackend.from_settings(modal_settings(tmp_path, gpu="A10G", secrets=["hf"]), modal_api=modal)
    options = backend.create_options("rl-test-0")
    inspect.signature(modal.Sandbox.create).bind(*backend.command("rl-test-0"), app=None, **options)
    inspect.signature(modal.Sandbox.from_name).bind("rl-test", "rl-test-0")
    inspect.signature(modal.Sandbox.list).bind(app_id="ap-1", tags={"rollouts_pool": "rl-test"})
    inspect.signature(modal.App.lookup).bind("rl-test", create_if_missing=True)
    for method in (modal.Sandbox.poll, modal.Sandbox.terminate, modal.Sandbox.get_tags):
        inspect.signature(method).bind(None)
    inspect.signature(modal.Sandbox.tunnels).bind(None, timeout=5)
    assert callable(modal.Sandbox.create.aio) and callable(modal.Sandbox.list.aio)


async def test_an_item_image_is_built_by_modal_once_and_its_sandboxes_run_on_it(pool, fake_modal, tmp_path) -> None:
    from temporal_rollouts.core.errors import ImageBuildFailed
    from temporal_rollouts.core.images import ImageSpec

    context = tmp_path / "task"
    context.mkdir()
    (context / "Dockerfile").write_text("FROM python:3.12-slim\nRUN pip install pytest\n")
    spec = ImageSpec(context=str(context), name="task")
    built = await asyncio.gather(*(pool.build_image(spec, "item 'task'") for _ in range(3)))
    assert len({image.remote for image in built}) == 1 and built[0].remote.startswith("im-")
    dockerfile_calls = [kwargs for name, _, kwargs in fake_modal.calls if name == "Image.from_dockerfile"]
    assert dockerfile_calls and all(call["add_python"] and call["context_dir"] == context for call in dockerfile_calls)
    layer = fake_modal.images[built[0].remote]
    assert (
        "apt bubblewrap libseccomp2" in layer.steps
        and "/opt/rollouts/lib/temporal_rollouts/sandbox_server" in layer.local_dirs
    )

    image = built[0]
    lease = await pool.acquire(Holder(workflow_id="on-image", run_id="r"), wait_s=10, image=image)
    assert lease.container_id == f"rl-test-{image.short}-0"
    create = next(
        kw for name, _, kw in fake_modal.calls if name == "Sandbox.create" and kw["name"] == lease.container_id
    )
    assert create["image"] is layer and create["tags"]["image_key"] == image.key
    (described,) = [c for c in await pool.describe() if c.container_id == lease.container_id]
    assert described.image == image.name
    await pool.release(lease)

    (context / "Dockerfile").write_text("FROM python:3.12-slim\nRUN FAKE-MODAL-BUILD-FAILS\n")
    with pytest.raises(ImageBuildFailed, match="item 'task'") as failed:
        await pool.build_image(spec, "item 'task'")
    assert not failed.value.retryable
