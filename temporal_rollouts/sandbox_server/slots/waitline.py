"""The line of acquire requests waiting for a slot, served first come, first served.

Each waiter is a future: a freed slot is granted to the oldest waiter the moment
it is handed back, with no polling. A waiter that gives up leaves the line; one
that is cancelled just after it was granted a slot gives that slot back.

A waiter may carry a ticket so that its caller can take its place back without
holding the request (the pool waits on several servers at once and withdraws the
losers). A withdrawal can overtake the acquire it names, because the two travel on
different connections; such a ticket is remembered for a while and an acquire that
arrives with it is answered "withdrawn" at once, instead of waiting out its wait.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict, deque
from collections.abc import Callable
from dataclasses import dataclass

from temporal_rollouts.sandbox_server.errors import SlotUnavailable
from temporal_rollouts.sandbox_server.schema import Holder, SlotLease

EARLY_WITHDRAWALS_KEPT = 10_000
EARLY_WITHDRAWAL_TTL_S = 600.0


@dataclass
class Waiter:
    holder: Holder
    ttl_s: float
    allow_network: bool
    granted: asyncio.Future[SlotLease]
    ticket: str | None = None
    reused: bool = False
    """Answered with a lease its holder already had, so leaving must not give that lease back."""


class WaitLine:
    def __init__(self) -> None:
        self._waiters: deque[Waiter] = deque()
        self._early: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return sum(not waiter.granted.done() for waiter in self._waiters)

    async def wait(
        self,
        holder: Holder,
        ttl_s: float,
        allow_network: bool,
        wait_s: float,
        give_back: Callable[[SlotLease], None],
        ticket: str | None = None,
        notify: Callable[[Waiter, str], None] | None = None,
    ) -> Waiter | None:
        """Queue up and wait up to `wait_s`; the served waiter (its lease in `granted`), or None
        when the wait ran out.

        Raises SlotUnavailable when the ticket is withdrawn. `notify(waiter, what)` is called
        when the waiter joins the line ("queued") and when it leaves it without a slot
        ("timeout", "cancelled"), so the owner can keep its counts and log."""
        if ticket is not None and self._early.pop(ticket, None) is not None:
            raise SlotUnavailable(f"acquire ticket {ticket} was withdrawn before it arrived")
        waiter = Waiter(holder, ttl_s, allow_network, asyncio.get_running_loop().create_future(), ticket)
        self._waiters.append(waiter)
        if notify:
            notify(waiter, "queued")
        try:
            await asyncio.wait({waiter.granted}, timeout=wait_s)
        except BaseException:
            granted = waiter.granted.done() and not waiter.granted.cancelled() and waiter.granted.exception() is None
            if granted and not waiter.reused:
                give_back(waiter.granted.result())
            elif not waiter.granted.done():
                self._give_up(waiter, "cancelled", notify)
            raise
        if not waiter.granted.done():
            self._give_up(waiter, "timeout", notify)
            return None
        waiter.granted.result()
        return waiter

    def withdraw(self, ticket: str) -> Waiter | None:
        """Take a waiting ticket out of line (its acquire answers SlotUnavailable); None when it was
        not waiting: already served, gone, or not arrived yet (then it is refused on arrival)."""
        waiter = next((w for w in self._waiters if w.ticket == ticket and not w.granted.done()), None)
        if waiter is None:
            self._remember_early(ticket)
            return None
        self._leave(waiter)
        waiter.granted.set_exception(SlotUnavailable(f"acquire ticket {ticket} was withdrawn"))
        return waiter

    def next_waiter(self) -> Waiter | None:
        """Take the oldest waiter still waiting out of line; the caller must resolve its future."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.granted.done():
                return waiter
        return None

    def turn_away(self, error: Exception) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.granted.done():
                waiter.granted.set_exception(error)

    def _give_up(self, waiter: Waiter, reason: str, notify: Callable[[Waiter, str], None] | None) -> None:
        self._leave(waiter)
        waiter.granted.cancel()
        if notify:
            notify(waiter, reason)

    def _leave(self, waiter: Waiter) -> None:
        try:
            self._waiters.remove(waiter)
        except ValueError:
            pass

    def _remember_early(self, ticket: str) -> None:
        now = time.monotonic()
        self._early[ticket] = now
        while self._early and (
            len(self._early) > EARLY_WITHDRAWALS_KEPT or next(iter(self._early.values())) < now - EARLY_WITHDRAWAL_TTL_S
        ):
            self._early.popitem(last=False)
