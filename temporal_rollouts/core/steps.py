"""What every step (activity) shares.

A long step heartbeats, so Temporal notices within seconds when its worker dies. Env
hooks return free-form data (setup metadata, verifier details) that travels through
Temporal: past a megabyte it is refused with an explanation, never retried, since the
same data would fail the same way on every attempt.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable
from typing import Any, TypeVar

from temporalio import activity

from temporal_rollouts.core.errors import PayloadTooLarge

T = TypeVar("T")

HEARTBEAT_EVERY_S = 2.0
HEARTBEATS_PER_TIMEOUT = 3


def heartbeat_interval() -> float:
    """A third of the step's heartbeat timeout: a step shorter than that never heartbeats (each
    heartbeat costs the worker CPU), and a busy event loop may fall two intervals behind before
    Temporal gives up on the step. HEARTBEAT_EVERY_S when the step has no heartbeat timeout."""
    timeout = activity.info().heartbeat_timeout if activity.in_activity() else None
    return timeout.total_seconds() / HEARTBEATS_PER_TIMEOUT if timeout else HEARTBEAT_EVERY_S


async def heartbeating(awaitable: Awaitable[T], every_s: float | None = None) -> T:
    """Await `awaitable`, heartbeating every `every_s` (by default `heartbeat_interval()`) meanwhile;
    cancelling the activity cancels it too."""
    every_s = every_s if every_s is not None else heartbeat_interval()
    task = asyncio.ensure_future(awaitable)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=every_s)
            if done:
                return task.result()
            activity.heartbeat()
    finally:
        if not task.done():
            task.cancel()


MAX_ENV_DATA_BYTES = 1024 * 1024


def ensure_small(what: str, value: dict[str, Any], limit: int = MAX_ENV_DATA_BYTES) -> dict[str, Any]:
    size = len(json.dumps(value, default=str).encode())
    if size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {limit}-byte limit for data that travels through Temporal; "
            "keep large artefacts in the workspace and return a summary"
        )
    return value
