"""Keeping the containers right: restart the dead, stop the idle, free the slots of closed rollouts.

These run periodically from a worker (and at the start of an acquire that finds a
dead container). Each is safe to run from several processes at once: restarts and
stops are decided under the registry lock after looking again, a stop only happens
after the server itself agreed that it is idle (`POST /drain`, atomic on the
server, after which it refuses new leases), and reaping releases by lease id.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from pydantic import BaseModel, Field

from temporal_rollouts.core.errors import RolloutError, SandboxUnreachable
from temporal_rollouts.sandbox.backends.registry import RegistryBusy
from temporal_rollouts.sandbox_server.schema import HealthStatus, Holder, SlotLease

if TYPE_CHECKING:
    from temporal_rollouts.sandbox.pool import SandboxPool

log = logging.getLogger(__name__)


class HealthReport(BaseModel):
    healthy: list[str] = Field(default_factory=list, description="Containers that answered, restarted ones included.")
    restarted: list[str] = Field(default_factory=list, description="Dead containers restarted in place.")
    removed: list[str] = Field(default_factory=list, description="Dead containers that could not be restarted.")
    lost_leases: list[SlotLease] = Field(default_factory=list, description="Leases the removed containers held.")


async def check_health(pool: SandboxPool) -> HealthReport:
    report = HealthReport()
    live = await pool.backend.list_containers()
    dead = await pool.backend.dead_containers() if pool.start_containers else []
    for info in dead:
        try:
            await pool.backend.restart_container(info.container_id)
            report.restarted.append(info.container_id)
            log.info("sandbox %s had died; restarted it in place", info.container_id)
        except RegistryBusy as err:
            log.warning("cannot restart sandbox %s now: %s", info.container_id, err)
        except RolloutError as err:
            lost = await pool.backend.forget_container(info.container_id)
            pool.forget_client(info.container_id)
            report.removed.append(info.container_id)
            report.lost_leases.extend(lost)
            log.error("sandbox %s died and cannot be restarted (%s); leases lost: %s", info.container_id, err, lost)
    if report.restarted:
        live = await pool.refresh()
    report.healthy = [info.container_id for info in live]
    return report


async def scale_down(pool: SandboxPool, min_containers: int, idle_s: float) -> list[str]:
    """Stop idle containers above `min_containers`, and every retiring one (not `accepting`) once idle."""
    stopped: list[str] = []
    async with pool.backend.exclusive():
        listed = await pool.backend.list_containers()
        pool.remember(listed)
        for info in listed:
            if not info.accepting and await _stop_if_idle(pool, info.container_id, 0.0):
                stopped.append(info.container_id)
        live = [info for info in listed if info.accepting]
        healths = await asyncio.gather(*(_health(pool, info.container_id) for info in live))
        idle = sorted(
            (health.idle_since, health.container_id)
            for health in healths
            if health is not None and health.idle_since is not None and time.time() - health.idle_since >= idle_s
        )
        remaining = len(live)
        for _, container_id in idle:
            if remaining <= min_containers:
                break
            if await _stop_if_idle(pool, container_id, idle_s):
                stopped.append(container_id)
                remaining -= 1
    if stopped:
        log.info("stopped idle sandbox containers: %s", ", ".join(stopped))
    return stopped


async def reap(
    pool: SandboxPool,
    is_closed: Callable[[Holder], Awaitable[bool]],
    before_release: Callable[[SlotLease], Awaitable[None]] | None = None,
) -> list[SlotLease]:
    """Free the leases of closed holders; `before_release` may save what the slot holds first."""
    freed: list[SlotLease] = []
    verdicts: dict[tuple[str, str], bool] = {}
    for lease in await pool.leases():
        key = (lease.holder.workflow_id, lease.holder.run_id)
        if key not in verdicts:
            try:
                verdicts[key] = await is_closed(lease.holder)
            except Exception as err:
                log.warning("cannot tell whether %s/%s has closed: %s", *key, err)
                verdicts[key] = False
        if not verdicts[key]:
            continue
        if before_release is not None:
            try:
                await before_release(lease)
            except Exception as err:
                log.warning("could not save slot %d of %s before reaping it: %s", lease.slot, lease.container_id, err)
        try:
            result = await pool.call(
                lease.container_id, lambda c, lease=lease: c.release(lease.slot, lease.lease_id, True, "reaped")
            )
        except SandboxUnreachable as err:
            log.warning("cannot reap lease %s on %s: %s", lease.lease_id, lease.container_id, err)
            continue
        if result.released:
            log.info("reaped slot %d of %s from closed workflow %s", lease.slot, lease.container_id, key[0])
            freed.append(lease)
    return freed


async def _stop_if_idle(pool: SandboxPool, container_id: str, idle_s: float) -> bool:
    """Stop a container if its server agrees it has been idle `idle_s` (and from then on refuses leases)."""
    try:
        drained = await (await pool.client(container_id)).drain(idle_s)
    except SandboxUnreachable:
        return False
    if not drained.draining:
        return False
    await pool.backend.stop_container(container_id)
    pool.forget_client(container_id)
    return True


async def _health(pool: SandboxPool, container_id: str) -> HealthStatus | None:
    try:
        return await (await pool.client(container_id)).health()
    except SandboxUnreachable:
        return None
