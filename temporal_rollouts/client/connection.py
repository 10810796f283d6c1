"""How every `rollouts` command reaches Temporal: the project's client, on a task queue whose workers
keep their data where this command's settings say (runtime/store_claim.py), or one line saying whose
it is instead. A command that read another checkout's batches, or started one that its workers run,
would read transcripts from a store they never wrote to."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.store_claim import check_store
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.storage.transcripts import TranscriptStore


async def command_client(
    settings: Settings, *, objects: S3StorageDriverClient | None = None, start_embedded: bool = True
) -> Client:
    client = await connect(settings, objects=objects, start_embedded=start_embedded)
    await check_store(client, settings)
    return client


async def inspection_client(settings: Settings) -> tuple[Client, TranscriptStore]:
    """A client that never starts a server (reading must not bring one up) and the transcript store."""
    objects = object_client(settings)
    client = await command_client(settings, objects=objects, start_embedded=False)
    return client, TranscriptStore(objects, settings.storage.bucket)
