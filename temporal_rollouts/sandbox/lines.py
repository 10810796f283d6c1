"""Waiting for a slot in every container's line at once, without ever dropping a lease.

Each wait has its own ticket. The first grant wins; every other ticket is withdrawn
and its answer read, and a lease granted in the race is released (and so reset) to
go to the next in line. Each line is first come, first served, so the whole is
approximately first come, first served. When this process starts another container
meanwhile, the waits are withdrawn and the caller looks again, so a waiter is not
left behind a full container while a new one sits empty.

An in-flight acquire is never simply dropped: a response that is never read may
carry a lease nobody knows about. A wait is ended by withdrawing its ticket and
reading the answer; only a server that does not answer even then (it is broken)
has its request cancelled, which also closes the connection and so takes the
request out of that server's line if it still can.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from temporal_rollouts.core.errors import SandboxUnreachable, SlotUnavailable
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.fleet import Fleet
from temporal_rollouts.sandbox_server.schema import AcquireRequest, SlotLease, WithdrawRequest

log = logging.getLogger(__name__)

Release = Callable[[SlotLease], Awaitable[Any]]
Waits = dict[asyncio.Task[SlotLease], tuple[SandboxClient, str]]


async def wait_everywhere(
    fleet: Fleet, container_ids: list[str], request: AcquireRequest, release: Release
) -> SlotLease | None:
    """Wait in line on every container at once, each for `request.wait_s`; the first lease granted, or
    None when none was. `release` gives back a lease granted in the race that another one won."""
    clients: dict[str, SandboxClient] = {}
    for container_id in container_ids:
        try:
            clients[container_id] = await fleet.client(container_id)
        except SandboxUnreachable:
            continue
    waits: Waits = {}
    for client in clients.values():
        ticket = f"{request.holder.workflow_id}/{uuid.uuid4().hex}"
        task = asyncio.create_task(client.send(request.model_copy(update={"ticket": ticket})))
        waits[task] = (client, ticket)
    won: SlotLease | None = None
    started = asyncio.ensure_future(fleet.next_start())
    try:
        pending: set[asyncio.Future] = {*waits, started}
        while waits.keys() & pending and won is None and not started.done():
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            won = next((task.result() for task in done if task in waits and _granted(task)), None)
    except BaseException:
        await _settle_in_background(fleet, waits, release)
        raise
    finally:
        started.cancel()
    try:
        await asyncio.shield(fleet.in_background(_settle(fleet, waits, release, keep=won)))
    except asyncio.CancelledError:
        if won is not None:
            fleet.in_background(release(won))
        raise
    if won is None and (problem := _lasting_problem(waits)) is not None:
        raise problem
    return won


def _lasting_problem(waits: Waits) -> BaseException | None:
    """An error that waiting again would only repeat (a bad request, a wrong token), if a wait ended in one."""
    for task in waits:
        if task.done() and not task.cancelled():
            error = task.exception()
            if error is not None and not isinstance(error, (SlotUnavailable, SandboxUnreachable)):
                return error
    return None


async def _settle(fleet: Fleet, waits: Waits, release: Release, keep: SlotLease | None = None) -> None:
    """Withdraw every wait still open, read every answer, and release every lease but `keep`."""
    open_waits = [task for task in waits if not task.done()]
    await asyncio.gather(
        *(waits[task][0].send(WithdrawRequest(ticket=waits[task][1])) for task in open_waits), return_exceptions=True
    )
    if open_waits:
        _, unanswered = await asyncio.wait(open_waits, timeout=fleet.options.request_timeout_s)
        for task in unanswered:
            log.warning("sandbox %s did not answer a withdrawn acquire; dropping it", waits[task][0].base_url)
            task.cancel()
        await asyncio.gather(*unanswered, return_exceptions=True)
    extra = [task.result() for task in waits if _granted(task)]
    extra = [lease for lease in extra if keep is None or lease.lease_id != keep.lease_id]
    for lease in extra:
        log.info("releasing slot %d of %s, granted in a race it lost", lease.slot, lease.container_id)
    results = await asyncio.gather(*(release(lease) for lease in extra), return_exceptions=True)
    for lease, result in zip(extra, results, strict=True):
        if isinstance(result, BaseException):
            log.warning("could not release surplus lease %s: %s", lease.lease_id, result)


async def _settle_in_background(fleet: Fleet, waits: Waits, release: Release) -> None:
    settling = fleet.in_background(_settle(fleet, waits, release))
    try:
        await asyncio.shield(settling)
    except asyncio.CancelledError:
        pass


def _granted(task: asyncio.Task[SlotLease]) -> bool:
    """Done with a lease; also marks any exception as retrieved."""
    return task.done() and not task.cancelled() and task.exception() is None
