"""Acquire and release sandbox slots, leased to the calling workflow execution."""

from __future__ import annotations

from datetime import datetime, timezone

from pydantic import BaseModel
from temporalio import activity

from temporal_rollouts.core.errors import SlotUnavailable, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.settings import SandboxSettings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder, ReleaseResult, SlotLease


class AcquireSlotInput(BaseModel):
    allow_network: bool = False


class SlotActivities:
    def __init__(self, pool: SandboxPool, settings: SandboxSettings) -> None:
        self._pool = pool
        self._settings = settings

    @activity.defn(name="acquire_slot")
    @checked_input
    async def acquire_slot(self, input: AcquireSlotInput) -> SlotLease:
        """Wait, first come first served, for a slot; give up after the acquire timeout,
        counted from the first attempt so that retries do not extend it. A retried
        attempt gets the lease its holder already has, never a second slot."""
        info = activity.info()
        holder = Holder(workflow_id=info.workflow_id or "", run_id=info.workflow_run_id or "")
        deadline = info.scheduled_time.timestamp() + self._settings.acquire_timeout_s
        remaining = deadline - datetime.now(timezone.utc).timestamp()
        with activity_boundary():
            try:
                return await heartbeating(self._pool.acquire(
                    holder, ttl_s=self._settings.lease_ttl_s, wait_s=max(remaining, 0.0),
                    allow_network=input.allow_network,
                ))
            except SlotUnavailable as err:
                raise SlotUnavailable(
                    f"no sandbox slot became free within {self._settings.acquire_timeout_s:.0f}s ({err.message})",
                    retryable=False,
                ) from err

    @activity.defn(name="release_slot")
    @checked_input
    async def release_slot(self, lease: SlotLease) -> ReleaseResult:
        with activity_boundary():
            return await self._pool.release(lease, reset=True)
