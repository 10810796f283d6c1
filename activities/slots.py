"""Acquire and release sandbox slots, leased to the calling workflow execution."""

from __future__ import annotations

import logging
from datetime import datetime, UTC
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from envs import get_env
from temporal_rollouts.core.errors import SlotUnavailable, activity_boundary
from temporal_rollouts.core.images import BuiltImage
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.settings import SandboxSettings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder, ReleaseResult, SlotLease, SlotLimitsRequest

log = logging.getLogger(__name__)


class AcquireSlotInput(BaseModel):
    env: str | None = None
    """The env the slot is for: whether its slot gets network is the env's own setting, looked up here on
    the worker, never taken from workflow input."""
    env_config: dict[str, Any] = Field(default_factory=dict)
    allow_network: bool = False
    """Ignored (kept so that inputs written by older workflows still parse): see `env`."""
    near: str | None = None
    """A container to try first: a branch's parent's, whose workspace its server then copies in place."""
    item: Item | None = None
    """The item the slot is for: the env may set network and limits per item (`Env.slot_network`,
    `Env.slot_limits`)."""
    image: BuiltImage | None = None
    """The item's image, as the build step made it ready: the slot runs on it. None: the server's own root."""


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
        remaining = deadline - datetime.now(UTC).timestamp()
        with activity_boundary():
            allow_network, limits = slot_terms(input)
            try:
                lease = await heartbeating(
                    self._pool.acquire(
                        holder,
                        ttl_s=self._settings.lease_ttl_s,
                        wait_s=max(remaining, 0.0),
                        allow_network=allow_network,
                        may_hold=info.attempt > 1,
                        near=input.near,
                        image=input.image,
                    )
                )
            except SlotUnavailable as err:
                raise SlotUnavailable(
                    f"no sandbox slot became free within {self._settings.acquire_timeout_s:.0f}s ({err.message})",
                    retryable=False,
                ) from err
            if limits is not None:
                await self._pool.lease(lease).narrow(limits)
            return lease

    @activity.defn(name="release_slot")
    @checked_input
    async def release_slot(self, lease: SlotLease) -> ReleaseResult:
        with activity_boundary():
            return await self._pool.release(lease)


def slot_terms(input: AcquireSlotInput) -> tuple[bool, SlotLimitsRequest | None]:
    """Whether the slot gets network and which narrower limits it runs within: the env's own settings,
    read here on the worker. A workflow input asking for network gets none."""
    if input.allow_network and not input.env:
        log.warning("acquire_slot ignores allow_network from workflow input; the env decides")
    if not input.env:
        return False, None
    env = get_env(input.env, input.env_config)
    if input.item is None:
        return env.allow_network, SlotLimitsRequest(**env.sandbox_limits) if env.sandbox_limits else None
    limits = env.slot_limits(input.item)
    return env.slot_network(input.item), SlotLimitsRequest(**limits) if limits else None
