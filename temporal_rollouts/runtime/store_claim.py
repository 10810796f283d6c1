"""Which object store (and local sandbox pool) the workers of a task queue share, recorded with Temporal.

Every step of a rollout may run on any worker polling its task queue, and each one reads what the
steps before it stored by reference: transcripts, token traces, workspace snapshots, large payloads.
Workers that poll one queue but keep those in different places run each other's steps and fail
them (`KeyError: no object rollouts/transcripts/... in /other/checkout/.rollouts/storage`): two
checkouts on one host did exactly that, both on the embedded server's default port and queue.

So the first worker of a queue records its store's identity on the Temporal server, in the memo of
the queue's slot-maintenance workflow (one long-lived execution per queue that every worker starts
anyway, and whose memo every worker and command can read, on any host); every later worker and
every `rollouts` command compares its own before it does anything, and refuses in one line naming
both. The identity is what must be the same for the steps to meet: the object store (an S3
endpoint and bucket, or a folder on one named host), and, for the local sandbox backend, whose
pool is a registry in one host's data folder, that folder. Workers on several hosts with S3 and a
remote backend agree although their own data folders differ; two checkouts on one host do not.
"""

from __future__ import annotations

import logging
import socket

from pydantic import BaseModel
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.schedules import ensure_maintenance_workflow, maintenance_workflow_id
from temporal_rollouts.runtime.temporal import host_name

log = logging.getLogger(__name__)

STORE_MEMO = "rollouts_store"
"""Memo key of the maintenance workflow that holds the queue's StoreClaim."""
PORT_STEP = 10
"""Suggested ports for a checkout of its own: the defaults plus a multiple of this."""


class StoreClaim(BaseModel):
    """What the workers of one task queue must share."""

    object_store: str
    """`s3://ENDPOINT/BUCKET` (`aws` for AWS's own endpoint), or `file://HOST/FOLDER/BUCKET` for a local store."""
    pool: str | None = None
    """The local sandbox backend's pool, `local://HOST/DATA_DIR` (its registry lives there); None for a remote backend."""
    data_dir: str
    """The data folder of the worker that claimed the queue (for the message; not compared)."""

    def differences(self, other: StoreClaim) -> list[str]:
        return [
            f"{name} {getattr(self, name)} here, {getattr(other, name)} there"
            for name in ("object_store", "pool")
            if getattr(self, name) != getattr(other, name)
        ]


def store_claim(settings: Settings) -> StoreClaim:
    host = host_name(settings)
    storage = settings.storage
    if storage.type == "s3":
        endpoint = (storage.endpoint_url or "aws").rstrip("/").split("://", 1)[-1]
        store = f"s3://{endpoint}/{storage.bucket}"
    else:
        store = f"file://{host}{settings.storage_path.resolve()}/{storage.bucket}"
    local = settings.sandbox.backend.type == "local"
    return StoreClaim(
        object_store=store,
        pool=f"local://{host}{settings.data_dir.resolve()}" if local else None,
        data_dir=str(settings.data_dir),
    )


async def claim_queue(client: Client, settings: Settings) -> WorkflowHandle:
    """What a worker does before it polls: start the queue's maintenance workflow with this store as its
    claim unless it runs, then refuse if the claim it holds is another store's. Returns its handle."""
    handle = await ensure_maintenance_workflow(client, settings, {STORE_MEMO: store_claim(settings).model_dump()})
    await check_store(client, settings)
    return handle


async def claimed_store(client: Client, settings: Settings) -> StoreClaim | None:
    """The claim recorded for this task queue, if a worker recorded one."""
    try:
        described = await client.get_workflow_handle(maintenance_workflow_id(settings)).describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    recorded = (await described.memo()).get(STORE_MEMO)
    return StoreClaim.model_validate(recorded) if isinstance(recorded, dict) else None


async def check_store(client: Client, settings: Settings) -> None:
    """Refuse, in one line, to work on a task queue whose workers keep their data elsewhere."""
    theirs = await claimed_store(client, settings)
    if theirs is None:
        return
    ours = store_claim(settings)
    differences = ours.differences(theirs)
    if not differences:
        return
    queue = settings.temporal.task_queue
    if settings.embedded:
        port, ui, policy = free_ports(settings)
        fix = (
            f"give this data folder a server of its own (ROLLOUTS_TEMPORAL__EMBEDDED_PORT={port} "
            f"ROLLOUTS_TEMPORAL__EMBEDDED_UI_PORT={ui} ROLLOUTS_DEMO_POLICY__PORT={policy}, or the same keys in "
            f"rollouts.toml), or use that one (ROLLOUTS_DATA_DIR={theirs.data_dir})"
        )
    else:
        fix = (
            f"point this worker at the same storage (and sandbox backend), or give it a task queue of its own "
            f"(temporal.task_queue); if that store is retired, end its claim with `temporal workflow terminate "
            f"--workflow-id {queue}-slot-maintenance`"
        )
    raise ConfigError(
        f"task queue {queue!r} on Temporal {settings.temporal_address} belongs to the workers of another data "
        f"folder ({theirs.data_dir}), whose steps this one could not read, nor they its: {'; '.join(differences)}. "
        f"To run both, {fix}"
    )


def free_ports(settings: Settings) -> tuple[int, int, int]:
    """Ports of a server, UI and demo policy of its own, each free now: the configured ones plus a step."""
    base = (settings.temporal.embedded_port, settings.temporal.embedded_ui_port, settings.demo_policy.port)
    for offset in range(PORT_STEP, 100 * PORT_STEP, PORT_STEP):
        ports = tuple(port + offset for port in base)
        if all(port < 65536 and _free(port) for port in ports):
            return ports  # type: ignore[return-value]
    return base


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
