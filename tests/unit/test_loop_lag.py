"""Task slots follow the worker's event loop: none past the maximum, only the minimum while it lags."""

from __future__ import annotations

import asyncio
import time

from temporal_rollouts.runtime import loop_lag
from temporal_rollouts.runtime.loop_lag import LoopLag, LoopLagSlotSupplier


async def test_slots_stop_at_the_maximum_and_come_back_on_release() -> None:
    supplier = LoopLagSlotSupplier(LoopLag(), maximum=3, minimum=1)
    for _ in range(3):
        await asyncio.wait_for(supplier.reserve_slot(None), 1)
    waiting = asyncio.create_task(supplier.reserve_slot(None))
    await asyncio.sleep(0.3)
    assert not waiting.done() and supplier.try_reserve_slot(None) is None
    supplier.release_slot(None)
    await asyncio.wait_for(waiting, 1)


async def test_a_lagging_loop_gets_only_the_minimum_until_it_catches_up() -> None:
    lag = LoopLag()
    supplier = LoopLagSlotSupplier(lag, maximum=100, minimum=2, max_lag_s=0.2)
    await supplier.reserve_slot(None)
    await asyncio.sleep(0.01)  # the watcher is asleep on its timer
    time.sleep(0.5)  # the loop is blocked: the watcher wakes up half a second late
    await asyncio.sleep(0.001)  # the watcher's overdue timer runs first
    assert lag.lag_s > 0.2
    await asyncio.wait_for(supplier.reserve_slot(None), 1)  # the second of the minimum
    assert supplier.try_reserve_slot(None) is None
    late = asyncio.create_task(supplier.reserve_slot(None))
    await asyncio.wait_for(late, 5)  # the lag settles once the loop runs on time
    assert lag.lag_s < 0.2


async def test_a_release_from_another_thread_wakes_a_waiting_reserve_at_once(monkeypatch) -> None:
    """Releases come from the SDK's threads; the loop is woken for them only when a reserve waits."""
    monkeypatch.setattr(loop_lag, "RECHECK_S", 10.0)  # so only the wake-up can end the wait in time
    supplier = LoopLagSlotSupplier(LoopLag(), maximum=1, minimum=1)
    await supplier.reserve_slot(None)
    waiting = asyncio.create_task(supplier.reserve_slot(None))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    started = time.monotonic()
    await asyncio.to_thread(supplier.release_slot, None)
    await asyncio.wait_for(waiting, 1)
    assert time.monotonic() - started < 2  # the wake-up, not the periodic recheck
    supplier.release_slot(None)  # nobody waits now: the slot is simply free again
    assert supplier.try_reserve_slot(None) is not None
