"""Keep a long step visibly alive, so Temporal notices within seconds when its worker dies."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import activity

T = TypeVar("T")

HEARTBEAT_EVERY_S = 2.0


async def heartbeating(awaitable: Awaitable[T], every_s: float = HEARTBEAT_EVERY_S) -> T:
    """Await `awaitable`, heartbeating meanwhile; cancelling the activity cancels it too."""
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
