"""A training run's finished groups in the object store, for the trainer door.

The run's workflow keeps only each group's key; the group itself (token ids, masks, logprobs,
scores, versions, messages: megabytes for long rollouts) is written here once by the activity
that builds it and read by any door endpoint that hands its batch out. Keys are stable
(`feeds/<run>/groups/<group>.json`), so a retried write replaces the object with the same
bytes, and a person can find a run's groups in the store.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from temporalio.contrib.aws.s3driver import S3StorageDriverClient

PREFIX = "feeds"


def group_key(run: str, group: str) -> str:
    """The key of group `group` (e.g. `g12`) of run `run`; names are quoted, so no run name leaves the prefix."""
    return f"{PREFIX}/{quote(run, safe='')}/groups/{quote(group, safe='')}.json"


class FeedGroupStore:
    def __init__(self, objects: S3StorageDriverClient, bucket: str) -> None:
        self._objects = objects
        self._bucket = bucket

    async def put(self, key: str, group: dict[str, Any]) -> None:
        await self._objects.put_object(bucket=self._bucket, key=key, data=json.dumps(group).encode())

    async def get(self, key: str) -> dict[str, Any]:
        """The group stored under `key`; KeyError when there is none."""
        return json.loads(await self._objects.get_object(bucket=self._bucket, key=key))
