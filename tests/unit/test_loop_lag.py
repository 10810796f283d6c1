"""Task slots follow the worker's event loop: none past the maximum, only the minimum while it lags."""

from __future__ import annotations

import asyncio
import time

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
