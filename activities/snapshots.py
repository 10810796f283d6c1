"""Save a failing rollout's workspace to the object store, and restore it into a new slot.

Both directions stream through a temporary file on the worker: the workspace tar.gz
never sits whole in memory, however large `storage.max_snapshot_bytes` allows it to be.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.errors import SnapshotTooLarge, TransferTooLarge, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.settings import StorageSettings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox.transfer import temp_path
from temporal_rollouts.sandbox_server.schema import SlotRef
from temporal_rollouts.storage.objects import object_from_file, object_to_file


class SnapshotInput(BaseModel):
    lease: SlotRef
    key: str


class SnapshotActivities:
    def __init__(self, pool: SandboxPool, objects: S3StorageDriverClient, settings: StorageSettings) -> None:
        self._pool = pool
        self._objects = objects
        self._settings = settings

    async def save(self, lease: SlotRef, key: str) -> int:
        with temp_path(suffix=".tar.gz") as archive:
            try:
                size = await self._pool.lease(lease).archive_to(archive, self._settings.max_snapshot_bytes)
            except (SnapshotTooLarge, TransferTooLarge) as err:
                raise SnapshotTooLarge(
                    f"{err.message}: over storage.max_snapshot_bytes, so a resume of this rollout starts over"
                ) from err
            await object_from_file(self._objects, bucket=self._settings.bucket, key=key, path=archive)
        return size

    async def load(self, lease: SlotRef, key: str) -> None:
        with temp_path(suffix=".tar.gz") as archive:
            await object_to_file(self._objects, bucket=self._settings.bucket, key=key, path=archive)
            await self._pool.lease(lease).restore_from(archive, self._settings.max_snapshot_bytes)

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
            await heartbeating(self.load(input.lease, input.key))
