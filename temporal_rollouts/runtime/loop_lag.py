"""Task slots handed out only while the worker's event loop keeps up (`worker.slot_supplier = "loop_lag"`).

A Python worker runs workflow tasks, activities and their I/O on one event loop. Past what
its core can serve, a fixed number of slots lets it take more tasks than it can run: the
loop falls seconds behind, model turns miss their heartbeat timeout and are sent again,
and workflow tasks time out, so the overload feeds itself. Here a slot is handed out only
while the loop answers within `max_lag_s` (or while fewer than `minimum` are in use, so
work always moves); otherwise the poll for a new task waits, and the work waits in
Temporal's task queue, where it costs nothing. Waiting costs no CPU, so a worker whose
model turns take a minute still takes its `maximum`; one whose steps come fast takes what
its core keeps up with. Unlike Temporal's resource-based tuner this watches only this
process, so other jobs on a shared machine do not starve it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from temporalio.worker import (
    CustomSlotSupplier,
    SlotMarkUsedContext,
    SlotPermit,
    SlotReleaseContext,
    SlotReserveContext,
)

TICK_S = 0.05
RECHECK_S = 0.1
MINIMUM_SLOTS = 8
"""Slots of each kind a lagging worker still takes, so that its tasks go out in batches, not one by one."""


class LoopLag:
    """How late the event loop runs a timer: a sleep of TICK_S that wakes up late measures the backlog."""

    def __init__(self) -> None:
        self.lag_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def ensure_started(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._watch())

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(TICK_S)
            late = loop.time() - started - TICK_S
            # Rise at once, settle slowly: one quiet tick does not mean the backlog is gone.
            self.lag_s = late if late > self.lag_s else 0.8 * self.lag_s + 0.2 * late


class LoopLagSlotSupplier(CustomSlotSupplier):
    def __init__(self, lag: LoopLag, maximum: int, *, minimum: int = MINIMUM_SLOTS, max_lag_s: float = 1.0) -> None:
        self._lag, self._maximum, self._minimum, self._max_lag_s = lag, maximum, min(minimum, maximum), max_lag_s
        self._used = 0
        self._waiting = 0  # reserve_slot calls waiting for a release: only they need the loop woken
        self._lock = threading.Lock()  # release_slot may come from the SDK's own thread
        self._loop: asyncio.AbstractEventLoop | None = None
        self._released: asyncio.Event | None = None

    def _take(self, wait_if_full: bool = False) -> bool:
        with self._lock:
            room = self._used < self._minimum or (self._used < self._maximum and self._lag.lag_s < self._max_lag_s)
            if room:
                self._used += 1
            elif wait_if_full:
                self._waiting += 1
            return room

    async def reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit:
        self._lag.ensure_started()
        if self._released is None:
            self._loop, self._released = asyncio.get_running_loop(), asyncio.Event()
        while not self._take(wait_if_full=True):
            # Woken by a release; a loop that has caught up is noticed at the next look.
            released = self._released
            try:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RECHECK_S):
                        await released.wait()
            finally:
                with self._lock:
                    self._waiting -= 1
            released.clear()
        return SlotPermit()

    def try_reserve_slot(self, ctx: SlotReserveContext) -> SlotPermit | None:
        return SlotPermit() if self._take() else None

    def mark_slot_used(self, ctx: SlotMarkUsedContext) -> None:
        pass

    def release_slot(self, ctx: SlotReleaseContext) -> None:
        with self._lock:
            self._used = max(self._used - 1, 0)
            waiting = self._waiting
        # Waking the loop costs a write and a read of its self-pipe: worth it only for a waiting reserve
        # (one that registers after this look finds the slot free in `_take`).
        if waiting and self._loop is not None and self._released is not None:
            self._loop.call_soon_threadsafe(self._released.set)
