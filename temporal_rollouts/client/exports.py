"""Every rollout of a batch, failed ones included, as JSONL: one record (client/records.py) a line, as
`rollouts show --json` and the web page give it."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from temporalio.client import Client

from temporal_rollouts.client.records import RolloutRecord, batch_rollout_ids, load_rollout, require_workflow
from temporal_rollouts.storage.transcripts import TranscriptStore

EXPORT_CONCURRENCY = 16
"""Rollouts an export reads at once (each is a describe, a result and a transcript walk)."""


async def export_batch(client: Client, transcripts: TranscriptStore, batch_id: str, output: Path) -> dict[str, Any]:
    """Write every rollout of a batch to `output`; what was written: the path, how many, by status."""
    await require_workflow(client, batch_id, "BatchWorkflow")
    ids = await batch_rollout_ids(client, batch_id)
    reading = asyncio.Semaphore(EXPORT_CONCURRENCY)

    async def load(rollout: str) -> RolloutRecord:
        async with reading:
            return await load_rollout(client, transcripts, rollout)

    records = await asyncio.gather(*(load(rollout) for rollout in ids))
    output.parent.mkdir(parents=True, exist_ok=True)
    with output.open("w", encoding="utf-8") as out:
        for record in records:
            out.write(json.dumps(record.shown()) + "\n")
    statuses: dict[str, int] = {}
    for record in records:
        statuses[record.status] = statuses.get(record.status, 0) + 1
    return {"batch_id": batch_id, "output": str(output), "rollouts": len(records), "statuses": statuses}
