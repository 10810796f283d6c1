"""The disk guard: slots measured between their calls, so what runs in the background is held to the limits too.

A job the stateful terminal left running, or a daemon a command started there, writes while no
call runs, and no check after a command sees it (the issue's 1.23 GB in 12 s). A few times a second
the guard measures every leased slot that has something running: one statfs for a volume of its
own, a walk for a checked one when `disk_watch` says one is due. A slot past a limit has its
processes stopped, once per crossing (`DiskWatch.judge`), and its next result says so.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from temporal_rollouts.sandbox_server.config import SlotLimits
from temporal_rollouts.sandbox_server.calls.execution import Slot
from temporal_rollouts.sandbox_server.calls.operations import OverLimit

log = logging.getLogger(__name__)

INTERVAL_S = 0.5


async def guard_disks(
    slots: list[Slot],
    limits_of: Callable[[Slot], SlotLimits],
    running: Callable[[Slot], bool],
    over_limit: OverLimit,
    interval_s: float = INTERVAL_S,
) -> None:
    """Run until cancelled: measure each leased slot with processes (`running`) against `limits_of` it."""
    while True:
        await asyncio.sleep(interval_s)
        for slot in slots:
            if slot.lease is None or slot.resetting or not running(slot):
                continue
            try:
                limits = limits_of(slot)
                usage = await slot.disk.background(slot.volume, limits)
                if usage is None:
                    continue
                passed, stop = slot.disk.judge(usage, slot.volume, limits)
                if passed is not None and stop:
                    await over_limit(slot.index, passed)
            except Exception:  # a slot whose volume went away meanwhile (a reset): the next pass sees it as it is
                log.exception("the disk guard could not measure slot %d", slot.index)
