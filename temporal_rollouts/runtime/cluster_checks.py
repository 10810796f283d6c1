"""Checks a worker makes at start so that a pool spread over several hosts fails loudly, not subtly.

The local backend keeps its containers on one host: their registry is a file on
that host's disk and their servers listen on its loopback. A second host polling
the same task queue would run slot steps of rollouts whose slot it cannot reach,
and would build a second pool of its own. Routing each slot step to the host that
holds the slot (a per-host task queue) could make that work, but a host that
dies then takes its slots' workspaces with it and strands every rollout on it,
which is what the remote backends already solve. So a worker with the local
backend refuses to start when a worker of another host polls its task queue, and
says to use a remote backend (static, nomad, modal) instead.

And payloads by reference must be readable from every host: local storage on a
non-embedded Temporal is warned about at start (a single host on a real
Temporal server is legitimate, so it is not refused).
"""

from __future__ import annotations

import logging
import time

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import host_name

log = logging.getLogger(__name__)

RECENT_POLL_S = 90.0
"""A poller seen this recently is alive: long polls return and are renewed at least once a minute."""


async def other_hosts_polling(client: Client, settings: Settings) -> set[str]:
    """Hosts other than this one with a worker polling our task queue lately (from `pid@host` identities)."""
    ours = host_name(settings)
    hosts: set[str] = set()
    for kind in (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY):
        reply = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=settings.temporal.namespace,
                task_queue=TaskQueue(name=settings.temporal.task_queue),
                task_queue_type=kind,
            )
        )
        for poller in reply.pollers:
            if time.time() - poller.last_access_time.ToSeconds() > RECENT_POLL_S:
                continue
            host = poller.identity.partition("@")[2] or poller.identity
            if host != ours:
                hosts.add(host)
    return hosts


async def check_local_backend_is_alone(client: Client, settings: Settings) -> None:
    if settings.sandbox.backend.type != "local":
        return
    others = await other_hosts_polling(client, settings)
    if others:
        raise ConfigError(
            f"the local sandbox backend serves one host, but workers on {sorted(others)} already poll task queue "
            f"{settings.temporal.task_queue!r}: their rollouts' slots would be unreachable from here. To run "
            "workers on several hosts, use a remote sandbox backend (sandbox.backend.type = static, nomad or "
            "modal); to run a separate single-host pool, give it its own temporal.task_queue."
        )


def warn_about_local_storage(settings: Settings) -> bool:
    """Loudly warn when payloads live on this host's disk while Temporal is shared; True if it warned."""
    if settings.embedded or settings.storage.type != "local":
        return False
    log.warning(
        "!!! storage.type is 'local' (%s) but Temporal is %s, not the embedded server: payloads by reference, "
        "transcripts and snapshots written here cannot be read by workers on other hosts. Use storage.type = "
        "'s3' for a cluster. !!!",
        settings.storage_path,
        settings.temporal_address,
    )
    return True
