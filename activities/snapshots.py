"""Save a failing rollout's workspace to the object store, and restore it into a new slot."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.errors import SnapshotTooLarge, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.settings import StorageSettings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotRef


class SnapshotInput(BaseModel):
    lease: SlotRef
    key: str


class SnapshotActivities:
    def __init__(self, pool: SandboxPool, objects: S3StorageDriverClient, settings: StorageSettings) -> None:
        self._pool = pool
        self._objects = objects
        self._settings = settings

    async def save(self, lease: SlotRef, key: str) -> int:
        try:
            archive = await self._pool.archive(lease, self._settings.max_snapshot_bytes)
        except SnapshotTooLarge as err:
            raise SnapshotTooLarge(
                f"{err.message}: over storage.max_snapshot_bytes, so a resume of this rollout starts over"
            ) from err
        await self._objects.put_object(bucket=self._settings.bucket, key=key, data=archive)
        return len(archive)

    @activity.defn(name="snapshot_workspace")
    @checked_input
    async def snapshot_workspace(self, input: SnapshotInput) -> str:
        with activity_boundary():
            await heartbeating(self.save(input.lease, input.key))
            return input.key

    @activity.defn(name="restore_workspace")
    @checked_input
    async def restore_workspace(self, input: SnapshotInput) -> None:
        with activity_boundary():
            archive = await self._objects.get_object(bucket=self._settings.bucket, key=input.key)
            await heartbeating(self._pool.restore(input.lease, archive))
