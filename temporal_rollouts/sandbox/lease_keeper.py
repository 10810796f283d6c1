"""Keep a rollout's slot lease alive through steps that do not touch the slot (model turns).

Every slot operation renews the lease on the sandbox; a model turn does not touch the
slot, so it renews the lease itself while it runs. A lease therefore only lapses when
no step of its rollout is running anywhere: the worker died and nothing retried it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

from temporal_rollouts.core.errors import RolloutError
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotRef

log = logging.getLogger(__name__)


@contextlib.asynccontextmanager
async def lease_kept(pool: SandboxPool, lease: SlotRef | None, ttl_s: float) -> AsyncIterator[None]:
    if lease is None:
        yield
        return

    slot = pool.lease(lease)

    async def renew_forever() -> None:
        # The step before this one touched the slot and renewed the lease: a turn shorter
        # than a third of the TTL needs no renewal at all.
        while True:
            await asyncio.sleep(max(ttl_s / 3, 1.0))
            try:
                await slot.renew(ttl_s)
            except RolloutError as err:  # the next slot operation reports it to the rollout
                log.warning("could not renew the lease on slot %s: %s", lease.slot, err.message)

    renewer = asyncio.create_task(renew_forever())
    try:
        yield
    finally:
        renewer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await renewer
