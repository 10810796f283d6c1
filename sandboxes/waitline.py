"""The line of acquire requests waiting for a slot, served first come, first served.

Each waiter is a future: a freed slot is granted to the oldest waiter the moment
it is handed back, with no polling. A waiter that gives up leaves the line; one
that is cancelled just after it was granted a slot gives that slot back.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from sandboxes.schema import Holder, SlotLease


@dataclass
class Waiter:
    holder: Holder
    ttl_s: float
    allow_network: bool
    granted: asyncio.Future[SlotLease]


class WaitLine:
    def __init__(self) -> None:
        self._waiters: deque[Waiter] = deque()

    def __len__(self) -> int:
        return sum(not waiter.granted.done() for waiter in self._waiters)

    async def wait(
        self,
        holder: Holder,
        ttl_s: float,
        allow_network: bool,
        wait_s: float,
        give_back: Callable[[SlotLease], None],
    ) -> SlotLease | None:
        """Queue up and wait up to `wait_s`; the granted lease, or None when the wait ran out."""
        waiter = Waiter(holder, ttl_s, allow_network, asyncio.get_running_loop().create_future())
        self._waiters.append(waiter)
        try:
            await asyncio.wait({waiter.granted}, timeout=wait_s)
        except BaseException:
            if waiter.granted.done() and not waiter.granted.cancelled() and waiter.granted.exception() is None:
                give_back(waiter.granted.result())
            raise
        finally:
            if not waiter.granted.done():
                waiter.granted.cancel()
                self._waiters.remove(waiter)
        return None if waiter.granted.cancelled() else waiter.granted.result()

    def serve_next(self, grant: Callable[[Waiter], SlotLease]) -> bool:
        """Grant a slot to the oldest waiter still waiting; False when nobody waits."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.granted.done():
                waiter.granted.set_result(grant(waiter))
                return True
        return False

    def turn_away(self, error: Exception) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.granted.done():
                waiter.granted.set_exception(error)
