"""Objects stored once under the hash of their bytes, read back through a worker-local cache.

Transcripts and token traces are both chains of such objects: a reference is a short
digest, so workflow histories carry a few dozen bytes however large the data grows,
and nothing is ever stored twice.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable
from typing import Protocol, TypeVar

from temporalio.contrib.aws.s3driver import S3StorageDriverClient

T = TypeVar("T")


class Linked(Protocol):
    parent: str | None


L = TypeVar("L", bound=Linked)

# 128 bits of SHA-256: collision-free for any store, and half the bytes in history.
DIGEST_HEX = 32


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:DIGEST_HEX]


ENTRY_OVERHEAD_BYTES = 1024
"""What a parsed object costs in memory beyond its stored bytes (a pydantic model and its dict), roughly."""
DEFAULT_CACHE_BYTES = 256 * 1024 * 1024


class _Lru:
    """Parsed objects, least recently used dropped first once their estimated size passes `capacity_bytes`.

    Bounded by size, not count: every rollout in flight reads its whole transcript each turn, so a
    cache that holds fewer objects than the rollouts in flight have drops each one just before it is
    read again, and every turn goes back to storage for all of it."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[str, tuple[object, int]] = OrderedDict()

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def get(self, key: str) -> object | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        self._entries.move_to_end(key)
        return entry[0]

    def put(self, key: str, value: object, stored_bytes: int) -> None:
        cost = stored_bytes + ENTRY_OVERHEAD_BYTES
        previous = self._entries.pop(key, None)
        if previous is not None:
            self.size_bytes -= previous[1]
        self._entries[key] = (value, cost)
        self.size_bytes += cost
        while self.size_bytes > self.capacity_bytes and len(self._entries) > 1:
            self.size_bytes -= self._entries.popitem(last=False)[1][1]


class ContentStore:
    """Content-addressed objects under `prefix/kind/digest` in one bucket."""

    def __init__(
        self, objects: S3StorageDriverClient, bucket: str, prefix: str, cache_bytes: int = DEFAULT_CACHE_BYTES
    ) -> None:
        self._objects = objects
        self._bucket = bucket
        self._prefix = prefix
        self._cache = _Lru(cache_bytes)

    async def put(self, kind: str, data: bytes, value: object) -> str:
        """Store `data` (once per worker); returns its digest, the key that references carry. The worker
        keeps `value` (the parsed form) so a later read costs neither I/O nor parsing."""
        key = digest(data)
        path = f"{self._prefix}/{kind}/{key}"
        # No "does it exist?" first: what a worker has not written or read itself is nearly always
        # new, and writing the same bytes under the same key again is harmless.
        if path not in self._cache:
            await self._objects.put_object(bucket=self._bucket, key=path, data=data)
        self._cache.put(path, value, len(data))
        return key

    async def get(self, kind: str, key: str, parse: Callable[[bytes], T]) -> T:
        path = f"{self._prefix}/{kind}/{key}"
        if (cached := self._cache.get(path)) is not None:
            return cached  # type: ignore[return-value]
        data = await self._objects.get_object(bucket=self._bucket, key=path)
        value = parse(data)
        self._cache.put(path, value, len(data))
        return value

    async def chain(self, kind: str, head: str, parse: Callable[[bytes], L]) -> list[L]:
        """The objects from the first to `head`, following each one's `parent` key."""
        found: list[L] = []
        key: str | None = head
        while key is not None:
            node = await self.get(kind, key, parse)
            found.append(node)
            key = node.parent
        return found[::-1]
