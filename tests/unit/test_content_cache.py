"""The worker's cache of stored objects (transcripts, token traces) is bounded by size, not count.

Every model turn reads its rollout's whole transcript. A cache holding fewer objects than the
rollouts in flight have drops each one just before it is read again, so it must hold them all
while they fit the memory it is given, and give back the least recently used when they do not.
"""

from __future__ import annotations

import asyncio

from temporal_rollouts.storage.content import ENTRY_OVERHEAD_BYTES, ContentStore


class CountingObjects:
    """Stored objects in a dict, counting the reads that reach storage."""

    def __init__(self) -> None:
        self.data: dict[str, bytes] = {}
        self.reads = 0

    async def put_object(self, *, bucket: str, key: str, data: bytes) -> None:
        self.data[f"{bucket}/{key}"] = data

    async def get_object(self, *, bucket: str, key: str) -> bytes:
        self.reads += 1
        return self.data[f"{bucket}/{key}"]


def test_the_objects_of_2000_rollouts_in_flight_are_read_without_going_back_to_storage():
    objects = CountingObjects()
    store = ContentStore(objects, "b", "t")  # the default size

    async def scenario() -> None:
        # 2,000 rollouts x 45 objects of a few hundred bytes: 90,000 objects, which a cache
        # of 20,000 entries dropped before each was read again.
        keys = [
            await store.put("nodes", f"rollout {i} object {j}".encode() * 10, (i, j))
            for i in range(2000)
            for j in range(45)
        ]
        for key in keys:
            await store.get("nodes", key, bytes.decode)

    asyncio.run(scenario())
    assert objects.reads == 0


def test_past_its_size_the_least_recently_used_object_goes_and_is_read_again_from_storage():
    objects = CountingObjects()
    store = ContentStore(objects, "b", "t", cache_bytes=3 * (4096 + ENTRY_OVERHEAD_BYTES))

    async def scenario() -> None:
        first, second, third = [await store.put("nodes", bytes([n]) * 4096, n) for n in range(3)]
        assert await store.get("nodes", first, lambda data: data[0]) == 0  # still held: now the most recent
        await store.put("nodes", bytes([3]) * 4096, 3)  # over the size: `second` is the oldest
        assert objects.reads == 0
        assert await store.get("nodes", second, lambda data: data[0]) == 1
        assert objects.reads == 1
        # what is read back is kept like what is written: it made room by dropping `third`, now the oldest
        assert await store.get("nodes", first, lambda data: data[0]) == 0 and objects.reads == 1
        assert await store.get("nodes", third, lambda data: data[0]) == 2 and objects.reads == 2

    asyncio.run(scenario())


def test_an_object_larger_than_the_whole_cache_is_still_kept_until_the_next_one():
    objects = CountingObjects()
    store = ContentStore(objects, "b", "t", cache_bytes=1024)

    async def scenario() -> None:
        big = await store.put("nodes", b"x" * 10_000, "big")
        assert await store.get("nodes", big, bytes.decode) == "big" and objects.reads == 0
        await store.put("nodes", b"y" * 10_000, "next")
        assert await store.get("nodes", big, bytes.decode) == "x" * 10_000 and objects.reads == 1

    asyncio.run(scenario())
