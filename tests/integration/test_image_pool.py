"""The pool matches slots to rollouts by image, with its bounds, its line and its scale-down per image.

The containers are real sandbox servers; what this file tests is the pool's placement by image, so
an "image" container here is a plain server the backend labels with the image (the servers that
really run on an image's root are tested in test_image_slots.py).
"""

from __future__ import annotations

import asyncio

import pytest

from temporal_rollouts.core.errors import SlotUnavailable
from temporal_rollouts.core.images import BuiltImage
from temporal_rollouts.core.settings import PoolOptions
from temporal_rollouts.sandbox.backends.base import ContainerInfo
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox.requests import HealthQuery
from tests.support.sandbox import eventually, holder, local_backend

A = BuiltImage(key="a" * 64, name="localhost/rollouts/task-a:" + "a" * 64)
B = BuiltImage(key="b" * 64, name="localhost/rollouts/task-b:" + "b" * 64)
C = BuiltImage(key="c" * 64, name="localhost/rollouts/task-c:" + "c" * 64)


class LabelledBackend(LocalBackend):
    """Starts plain servers and labels them with the image they were asked for."""

    async def _launch(self, container_id: str, image: BuiltImage | None) -> ContainerInfo:
        info = await super()._launch(container_id, None)
        return info.model_copy(update={"image": image})


@pytest.fixture
async def backend(tmp_path):
    async with local_backend(tmp_path / "data", 1, LabelledBackend) as backend:
        yield backend


def images_of(backend: LocalBackend) -> list[str | None]:
    return sorted((info.image_key or "-")[:1] for info in backend.registry.load())


async def test_a_rollout_gets_a_slot_of_its_own_image_and_a_container_is_started_for_it(backend):
    async with SandboxPool(backend, PoolOptions(min_containers=1, max_containers=4)) as pool:
        await pool.fleet.ensure_running()
        plain = await pool.acquire(holder("plain"), ttl_s=60, wait_s=0)
        on_a = await pool.acquire(holder("on-a"), ttl_s=60, wait_s=5, image=A)
        on_b = await pool.acquire(holder("on-b"), ttl_s=60, wait_s=5, image=B)
        assert images_of(backend) == ["-", "a", "b"]
        by_id = {info.container_id: info.image_key for info in backend.registry.load()}
        assert (by_id[plain.container_id], by_id[on_a.container_id], by_id[on_b.container_id]) == (None, A.key, B.key)
        await pool.release(on_a)
        again = await pool.acquire(holder("again-a"), ttl_s=60, wait_s=5, image=A)
        assert again.container_id == on_a.container_id, "a free slot of the image is taken before a new container"
        described = {c.container_id: c.image for c in await pool.describe()}
        assert described[on_a.container_id] == A.name and described[plain.container_id] is None


async def test_the_bounds_and_the_line_hold_per_image(backend):
    async with SandboxPool(
        backend, PoolOptions(min_containers=0, max_containers=3, max_containers_per_image=1)
    ) as pool:
        first_a = await pool.acquire(holder("first-a"), ttl_s=60, wait_s=5, image=A)
        waiting = [asyncio.create_task(pool.acquire(holder(f"a{n}"), ttl_s=60, wait_s=20, image=A)) for n in range(2)]
        await asyncio.sleep(0.3)  # they line up in order
        on_b = await pool.acquire(holder("on-b"), ttl_s=60, wait_s=5, image=B)
        assert images_of(backend) == ["a", "b"], "one container of A at most; B gets its own meanwhile"
        assert not any(task.done() for task in waiting)
        await pool.release(first_a)
        second = await asyncio.wait_for(asyncio.shield(waiting[0]), 5)
        assert second.container_id == first_a.container_id and not waiting[1].done(), "first come, first served"
        await pool.release(second)
        third = await asyncio.wait_for(waiting[1], 5)
        await pool.release(third)
        await pool.release(on_b)
        assert len(await pool.leases()) == 0


async def test_an_image_takes_the_place_of_an_idle_one_when_the_pool_is_full(backend):
    async with SandboxPool(backend, PoolOptions(min_containers=0, max_containers=2)) as pool:
        held_a = await pool.acquire(holder("a"), ttl_s=60, wait_s=5, image=A)
        held_b = await pool.acquire(holder("b"), ttl_s=60, wait_s=5, image=B)
        await pool.release(held_b)  # B is idle now, A busy
        on_c = await pool.acquire(holder("c"), ttl_s=60, wait_s=10, image=C)
        assert images_of(backend) == ["a", "c"], "the idle B container made room for C"
        waiting_b = asyncio.create_task(pool.acquire(holder("b-again"), ttl_s=60, wait_s=20, image=B))
        await asyncio.sleep(0.5)
        assert not waiting_b.done(), "no container is idle: B waits"
        await pool.release(held_a)
        again_b = await asyncio.wait_for(waiting_b, 10)
        assert images_of(backend) == ["b", "c"] and again_b.container_id not in (held_a.container_id,)
        await pool.release(on_c)
        await pool.release(again_b)


async def test_a_wait_for_an_image_with_no_room_times_out_as_slot_unavailable(backend):
    async with SandboxPool(backend, PoolOptions(min_containers=0, max_containers=1)) as pool:
        held = await pool.acquire(holder("a"), ttl_s=60, wait_s=5, image=A)
        with pytest.raises(SlotUnavailable, match="task-b"):
            await pool.acquire(holder("b"), ttl_s=60, wait_s=1, image=B)
        await pool.release(held)
        assert len(await pool.leases()) == 0


async def test_idle_images_are_scaled_down_to_none_and_the_own_root_to_its_minimum(backend):
    async with SandboxPool(backend, PoolOptions(min_containers=1, max_containers=4)) as pool:
        await pool.fleet.ensure_running()
        for image in (A, B):
            await pool.release(await pool.acquire(holder("x"), ttl_s=60, wait_s=5, image=image))
        busy = await pool.acquire(holder("busy"), ttl_s=60, wait_s=5, image=C)
        assert images_of(backend) == ["-", "a", "b", "c"]

        async def idle_everywhere() -> bool:
            healths = [await pool.fleet.send(info.container_id, HealthQuery()) for info in backend.registry.load()]
            return sum(health.idle_since is not None for health in healths) == 3

        assert await eventually(idle_everywhere)
        stopped = await pool.fleet.scale_down(idle_s=0)
        assert len(stopped) == 2 and images_of(backend) == ["-", "c"], "A and B go; C is busy, one own root stays"
        await pool.release(busy)
        assert len(await pool.fleet.scale_down(idle_s=0)) == 1 and images_of(backend) == ["-"]
