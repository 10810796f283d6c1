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


class _Lru(OrderedDict):
    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def put(self, key: str, value: object) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > self.capacity:
            self.popitem(last=False)


class ContentStore:
    """Content-addressed objects under `prefix/kind/digest` in one bucket."""

    def __init__(self, objects: S3StorageDriverClient, bucket: str, prefix: str, cache_entries: int = 20_000) -> None:
        self._objects = objects
        self._bucket = bucket
        self._prefix = prefix
        self._cache = _Lru(cache_entries)

    async def put(self, kind: str, data: bytes, value: object) -> str:
        """Store `data` (once per worker); returns its digest, the key that references carry. The worker
        keeps `value` (the parsed form) so a later read costs neither I/O nor parsing."""
        key = digest(data)
        path = f"{self._prefix}/{kind}/{key}"
        # No "does it exist?" first: what a worker has not written or read itself is nearly always
        # new, and writing the same bytes under the same key again is harmless.
        if path not in self._cache:
            await self._objects.put_object(bucket=self._bucket, key=path, data=data)
        self._cache.put(path, value)
        return key

    async def get(self, kind: str, key: str, parse: Callable[[bytes], T]) -> T:
        path = f"{self._prefix}/{kind}/{key}"
        if (cached := self._cache.get(path)) is not None:
            self._cache.move_to_end(path)
            return cached
        value = parse(await self._objects.get_object(bucket=self._bucket, key=path))
        self._cache.put(path, value)
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
