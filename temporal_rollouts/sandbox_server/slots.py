"""SlotManager: the slots of one sandbox container, leased to rollouts and worked on by call id.

The HTTP server is a thin wrapper around this class, and this class is the authority
for its slots: leases are persisted, so a restarted process keeps them. A slot is
leased to one holder at a time; waiters are served first come, first served the
moment a slot is handed back. A waiter can be withdrawn by ticket, or leaves when
its caller goes away, so a dead client never keeps a place in line nor receives a
slot. Leases that are not renewed lapse (checked on every operation and by a
background sweeper) and their slot is reset and handed on. Every change is written
to the lease event log (see `temporal_rollouts.sandbox_server.lease_log`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import time
import uuid
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, NamedTuple

from temporal_rollouts.sandbox_server import isolation
from temporal_rollouts.sandbox_server.archive import archive_workspace, restore_workspace
from temporal_rollouts.sandbox_server.errors import BadToolRequest, LeaseLost, SlotUnavailable
from temporal_rollouts.sandbox_server.execution import CallRunner, Slot
from temporal_rollouts.sandbox_server.files import clear_directory
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_MAX_OUTPUT_CHARS,
    DrainResult,
    ExecuteRequest,
    HealthStatus,
    Holder,
    LeaseEventKind,
    ReleaseResult,
    RestoreResult,
    SlotLease,
    SlotState,
    ToolOutput,
    WorkspaceArchive,
)
from temporal_rollouts.sandbox_server.slotbook import SlotBook
from temporal_rollouts.sandbox_server.waitline import Waiter, WaitLine

log = logging.getLogger(__name__)


class Grant(NamedTuple):
    lease: SlotLease
    fresh: bool
    """False when the holder already had this lease: giving it back would take a slot it uses."""


class SlotManager:
    def __init__(
        self,
        root: Path,
        slots: int,
        container_id: str,
        *,
        require_isolation: bool = False,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
        sweep_interval_s: float = 2.0,
        journal_limit: int = 10_000,
    ) -> None:
        if slots < 1:
            raise ValueError("a sandbox container needs at least one slot")
        self.root = root
        self.container_id = container_id
        self.require_isolation = require_isolation
        self.sweep_interval_s = sweep_interval_s
        self._line = WaitLine()
        self._book = SlotBook(root, slots, container_id, self._line)
        self._slots = self._book.slots
        self._runner = CallRunner(root, max_output_chars, require_isolation, journal_limit)
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._draining = False

    async def start(self) -> None:
        """Clear workspaces no live lease owns (left by an earlier process) and start the sweeper."""
        if self.isolation_mode == "none":
            if self.require_isolation:
                log.error("bubblewrap is missing and isolation is required: every command will be refused")
            else:
                isolation.warn_unisolated_once()
        await asyncio.gather(*(asyncio.to_thread(clear_directory, s.workspace) for s in self._slots if s.free))
        self._sweeper = asyncio.create_task(self._sweep_forever())

    async def close(self) -> None:
        """Stop the sweeper, kill running operations and turn waiters away; leases stay persisted."""
        if self._closing:
            return
        self._closing = self._runner.closing = True
        if self._sweeper:
            self._sweeper.cancel()
        self._line.turn_away(SlotUnavailable("the sandbox server is shutting down"))
        running = [task for slot in self._slots for task in slot.running] + list(self._background)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, *(t for t in [self._sweeper] if t), return_exceptions=True)
        await self._runner.sessions.close({slot.index: slot.workspace for slot in self._slots})

    async def __aenter__(self) -> SlotManager:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def isolation_mode(self) -> isolation.IsolationMode:
        return "bubblewrap" if isolation.bubblewrap_path() else "none"

    def health(self) -> HealthStatus:
        self._expire_lapsed()
        return HealthStatus(
            container_id=self.container_id,
            slots=len(self._slots),
            free=sum(slot.free for slot in self._slots),
            waiters=len(self._line),
            isolation=self.isolation_mode,
            idle_since=self._book.idle_since,
            draining=self._draining,
        )

    def slot_states(self) -> list[SlotState]:
        self._expire_lapsed()
        return [SlotState(slot=s.index, lease=s.lease, busy=bool(s.running)) for s in self._slots]

    async def acquire(
        self, holder: Holder, ttl_s: float, wait_s: float, allow_network: bool = False, ticket: str | None = None
    ) -> SlotLease:
        """Lease a slot, waiting up to `wait_s` in line; a holder that already has one gets it again."""
        return (await self.take(holder, ttl_s, wait_s, allow_network, ticket)).lease

    async def take(
        self, holder: Holder, ttl_s: float, wait_s: float, allow_network: bool = False, ticket: str | None = None
    ) -> Grant:
        """`acquire`, also telling whether the lease is new, for callers that may have to give it back.

        wait_s=0 never queues: it takes a free slot when nobody waits, or fails at once."""
        if ttl_s <= 0 or wait_s < 0:
            raise BadToolRequest("ttl_s must be positive and wait_s not negative")
        if self._draining or self._closing:
            raise SlotUnavailable(f"sandbox {self.container_id} is draining to stop and takes no new leases")
        self._expire_lapsed()
        if (held := self._book.held_by(holder)) is not None:
            return Grant(self._grant(held, holder, ttl_s, allow_network, reuse=True), False)
        if not len(self._line) and (slot := next((s for s in self._slots if s.free), None)):
            return Grant(self._grant(slot, holder, ttl_s, allow_network), True)
        if wait_s == 0:
            raise SlotUnavailable(f"no slot of sandbox {self.container_id} is free")
        served = await self._line.wait(
            holder, ttl_s, allow_network, wait_s, give_back=self.give_back, ticket=ticket, notify=self._waiter_moved
        )
        if served is None:
            raise SlotUnavailable(f"no slot of sandbox {self.container_id} became free within {wait_s:g}s")
        return Grant(served.granted.result(), not served.reused)

    def withdraw(self, ticket: str, reason: str = "withdrawn") -> bool:
        """Take a waiting acquire out of line; False when it was not waiting (granted, gone, not yet here)."""
        waiter = self._line.withdraw(ticket)
        if waiter is not None:
            self._waiter_moved(waiter, reason)
        return waiter is not None

    def drain(self, idle_s: float) -> DrainResult:
        """Refuse new leases from now on, but only if the server has been idle `idle_s` (atomic here,
        so no lease or waiter can slip in between the check and the stop that follows)."""
        self._expire_lapsed()
        idle_since = self._book.idle_since
        if not self._draining and idle_since is not None and time.time() - idle_since >= idle_s:
            self._draining = True
            self._line.turn_away(SlotUnavailable(f"sandbox {self.container_id} is draining to stop"))
        return DrainResult(draining=self._draining, idle_since=idle_since)

    def renew(self, slot: int, lease_id: str, ttl_s: float) -> SlotLease:
        if ttl_s <= 0:
            raise BadToolRequest("ttl_s must be positive")
        leased = self._leased(slot, lease_id, ttl_s)
        assert leased.lease is not None
        return leased.lease

    async def release(self, slot: int, lease_id: str, reset: bool = True, reason: str = "released") -> ReleaseResult:
        """Give a slot back (idempotent): released=False when the lease was already gone."""
        self._expire_lapsed()
        if not 0 <= slot < len(self._slots):
            return ReleaseResult(released=False)
        target = self._slots[slot]
        if target.lease is None or target.lease.lease_id != lease_id:
            return ReleaseResult(released=False)
        kind: LeaseEventKind = "reaped" if reason == "reaped" else "released"
        await asyncio.shield(self._retire(target, reset=reset, kind=kind))
        return ReleaseResult(released=True)

    async def execute(self, request: ExecuteRequest) -> ToolOutput:
        """Run one operation in a leased slot, or answer a repeated call id from its stored result."""
        slot = self._leased(request.slot, request.lease_id)
        return await self._runner.execute(slot, request, self._ran)

    def leased_slot(self, index: int, lease_id: str) -> Slot:
        """The slot leased under `lease_id` (renewing the lease), for work beside `execute`: transfers."""
        return self._leased(index, lease_id)

    async def archive(self, slot: int, lease_id: str, max_bytes: int) -> WorkspaceArchive:
        """The leased slot's workspace as a tarball, for a rollout that will be resumed elsewhere."""
        target = self._leased(slot, lease_id)
        data = await asyncio.to_thread(archive_workspace, target.workspace, max_bytes)
        return WorkspaceArchive(data=base64.b64encode(data).decode(), size=len(data))

    async def restore(self, slot: int, lease_id: str, data: str) -> RestoreResult:
        """Replace the leased slot's workspace with a saved one."""
        target = self._leased(slot, lease_id)
        try:
            raw = base64.b64decode(data, validate=True)
        except ValueError as err:
            raise BadToolRequest(f"the workspace snapshot is not base64: {err}") from None
        return RestoreResult(entries=await asyncio.to_thread(restore_workspace, target.workspace, raw))

    def _ran(self, slot: Slot, lease_id: str) -> None:
        if slot.lease and slot.lease.lease_id == lease_id:
            self._renew(slot)

    def _leased(self, index: int, lease_id: str, ttl_s: float | None = None) -> Slot:
        self._expire_lapsed()
        if not 0 <= index < len(self._slots):
            raise BadToolRequest(f"sandbox {self.container_id} has no slot {index}")
        slot = self._slots[index]
        if slot.lease is None or slot.lease.lease_id != lease_id:
            raise LeaseLost(f"slot {index} is no longer leased under {lease_id}: it was released or the lease expired")
        if ttl_s is not None:
            slot.ttl_s = ttl_s
        self._renew(slot)
        return slot

    def _renew(self, slot: Slot) -> None:
        assert slot.lease is not None
        slot.lease = slot.lease.model_copy(update={"expires_at": time.time() + slot.ttl_s})
        self._book.renewed(slot)

    def _grant(self, slot: Slot, holder: Holder, ttl_s: float, allow_network: bool, reuse: bool = False) -> SlotLease:
        slot.lease = SlotLease(
            container_id=self.container_id,
            slot=slot.index,
            lease_id=slot.lease.lease_id if reuse and slot.lease else uuid.uuid4().hex,
            holder=holder,
            expires_at=time.time() + ttl_s,
        )
        slot.ttl_s, slot.allow_network = ttl_s, allow_network
        self._book.granted(slot)
        if not reuse:
            self._book.record("granted", slot=slot.index, lease=slot.lease)
        return slot.lease

    def _hand_over(self, slot: Slot) -> bool:
        """Grant a free slot to the oldest waiter; a waiter whose holder already has a slot here gets that
        lease back instead, and the slot goes on down the line. True when a waiter got this slot."""
        while slot.free and (waiter := self._line.next_waiter()) is not None:
            if (held := self._book.held_by(waiter.holder)) is not None:
                waiter.reused = True
                waiter.granted.set_result(self._grant(held, waiter.holder, waiter.ttl_s, waiter.allow_network, True))
                continue
            waiter.granted.set_result(self._grant(slot, waiter.holder, waiter.ttl_s, waiter.allow_network))
            return True
        return False

    def give_back(self, lease: SlotLease, reason: str | None = None) -> None:
        """Release a lease whose new holder never learnt of it (it left in the instant it was granted)."""
        slot = self._slots[lease.slot]
        if slot.lease and slot.lease.lease_id == lease.lease_id:
            self._retire(slot, reset=True, kind="released", reason=reason or "granted to a waiter that left")

    def _retire(
        self, slot: Slot, *, reset: bool, kind: LeaseEventKind, reason: str | None = None
    ) -> asyncio.Task[None]:
        """Take the lease away now; kill what runs, reset and hand the slot on in a task.

        The event is written once the hand-over is known, stamped with the time the lease ended."""
        lease = slot.lease
        slot.lease, slot.resetting = None, True
        if lease is not None:
            self._book.ended(lease)
        self._book.update_idle()
        snapshot = self._book.snapshot()
        return self._spawn(self._reset_and_hand_over(slot, reset, kind, lease, reason, snapshot))

    async def _reset_and_hand_over(
        self, slot: Slot, reset: bool, kind: LeaseEventKind, lease: SlotLease | None, reason: str | None, at: dict
    ) -> None:
        handed = False
        try:
            for task in list(slot.running):
                task.cancel()
            await asyncio.gather(*slot.running, return_exceptions=True)
            await self._runner.sessions.stop(slot.index, slot.workspace)  # the lease ended: so does its terminal
            if reset:
                async with slot.lock:
                    await asyncio.to_thread(clear_directory, slot.workspace)
        except Exception:
            log.exception("resetting slot %d failed; handing it on as it is", slot.index)
        finally:
            slot.resetting = False
            if not self._closing:
                handed = self._hand_over(slot)
            self._book.record(kind, slot=slot.index, lease=lease, handed_over=handed, reason=reason, **at)

    def _waiter_moved(self, waiter: Waiter, what: str) -> None:
        kind: LeaseEventKind = "queued" if what == "queued" else "withdrawn"
        self._book.record(kind, holder=waiter.holder, reason=None if what == "queued" else what)

    def _expire_lapsed(self) -> None:
        now = time.time()
        for slot in self._slots:
            if slot.lease and slot.lease.expires_at <= now and not slot.running:
                log.info("lease %s on slot %d lapsed; resetting the slot", slot.lease.lease_id, slot.index)
                self._retire(slot, reset=True, kind="expired")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.sweep_interval_s)
            try:
                self._expire_lapsed()
            except Exception:
                log.exception("lease sweep failed")

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task
