"""SlotManager: the slots of one sandbox container, leased to rollouts and worked on by call id.

The HTTP server is a thin wrapper around this class. A slot is leased to one
holder at a time; waiters are served first come, first served the moment a slot
is handed back. Leases that are not renewed lapse (checked on every operation and
by a background sweeper) and their slot is reset and handed on. Every operation
result is stored by call id, so a retried call is answered without running twice,
even by a restarted server process.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Coroutine
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollouts.errors import BadToolRequest, LeaseLost, SandboxUnreachable, SlotUnavailable
from sandboxes import isolation
from sandboxes.files import clear_directory
from sandboxes.operations import SlotContext, run_operation
from sandboxes.persistence import ExecutionLog, LeaseStore, ResultJournal, StoredLease, StoredResult
from sandboxes.schema import ExecuteRequest, HealthStatus, Holder, ReleaseResult, SlotLease, SlotState, ToolOutput
from sandboxes.waitline import WaitLine

log = logging.getLogger(__name__)


@dataclass
class _Slot:
    index: int
    workspace: Path
    lease: SlotLease | None = None
    ttl_s: float = 0.0
    allow_network: bool = False
    resetting: bool = False
    running: set[asyncio.Task[ToolOutput]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def free(self) -> bool:
        return self.lease is None and not self.resetting


class SlotManager:
    def __init__(
        self,
        root: Path,
        slots: int,
        container_id: str,
        *,
        require_isolation: bool = False,
        max_output_chars: int = 50_000,
        sweep_interval_s: float = 2.0,
        journal_limit: int = 10_000,
    ) -> None:
        if slots < 1:
            raise ValueError("a sandbox container needs at least one slot")
        self.root = root
        self.container_id = container_id
        self.require_isolation = require_isolation
        self.max_output_chars = max_output_chars
        self.sweep_interval_s = sweep_interval_s
        self._slots = [_Slot(index, root / f"slot-{index}" / "workspace") for index in range(slots)]
        for slot in self._slots:
            slot.workspace.mkdir(parents=True, exist_ok=True)
        self._line = WaitLine()
        self._journal = ResultJournal(root / "results.jsonl", limit=journal_limit)
        self._executions = ExecutionLog(root / "executions.jsonl")
        self._lease_store = LeaseStore(root / "leases.json")
        self._inflight: dict[str, asyncio.Task[ToolOutput]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._closing = False
        self._restore_leases()

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
        self._closing = True
        if self._sweeper:
            self._sweeper.cancel()
        self._line.turn_away(SlotUnavailable("the sandbox server is shutting down"))
        running = [task for slot in self._slots for task in slot.running] + list(self._background)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, *(t for t in [self._sweeper] if t), return_exceptions=True)

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
        )

    def slot_states(self) -> list[SlotState]:
        self._expire_lapsed()
        return [SlotState(slot=s.index, lease=s.lease, busy=bool(s.running)) for s in self._slots]

    async def acquire(self, holder: Holder, ttl_s: float, wait_s: float, allow_network: bool = False) -> SlotLease:
        """Lease a slot, waiting up to `wait_s` in line; a holder that already has one gets it again."""
        if ttl_s <= 0 or wait_s < 0:
            raise BadToolRequest("ttl_s must be positive and wait_s not negative")
        self._expire_lapsed()
        for slot in self._slots:
            if slot.lease and slot.lease.holder == holder:
                return self._grant(slot, holder, ttl_s, allow_network, lease_id=slot.lease.lease_id)
        if not len(self._line) and (slot := next((s for s in self._slots if s.free), None)):
            return self._grant(slot, holder, ttl_s, allow_network)
        lease = await self._line.wait(holder, ttl_s, allow_network, wait_s, give_back=self._give_back)
        if lease is None:
            raise SlotUnavailable(f"no slot of sandbox {self.container_id} became free within {wait_s:g}s")
        return lease

    def renew(self, slot: int, lease_id: str, ttl_s: float) -> SlotLease:
        if ttl_s <= 0:
            raise BadToolRequest("ttl_s must be positive")
        leased = self._leased(slot, lease_id, ttl_s)
        assert leased.lease is not None
        return leased.lease

    async def release(self, slot: int, lease_id: str, reset: bool = True) -> ReleaseResult:
        """Give a slot back (idempotent): released=False when the lease was already gone."""
        self._expire_lapsed()
        if not 0 <= slot < len(self._slots):
            return ReleaseResult(released=False)
        target = self._slots[slot]
        if target.lease is None or target.lease.lease_id != lease_id:
            return ReleaseResult(released=False)
        await asyncio.shield(self._retire(target, reset=reset))
        return ReleaseResult(released=True)

    async def execute(self, request: ExecuteRequest) -> ToolOutput:
        """Run one operation in a leased slot, or answer a repeated call id from its stored result."""
        slot = self._leased(request.slot, request.lease_id)
        if (stored := self._journal.get(request.call_id)) is not None:
            return stored.model_copy(update={"replayed": True})
        if (first := self._inflight.get(request.call_id)) is not None:
            output = await self._outcome(first)
            return output.model_copy(update={"replayed": True})
        task = asyncio.create_task(self._run(slot, request))
        self._inflight[request.call_id] = task
        slot.running.add(task)

        def forget(done: asyncio.Task[ToolOutput]) -> None:
            self._inflight.pop(request.call_id, None)
            slot.running.discard(done)

        task.add_done_callback(forget)
        return await self._outcome(task)

    async def _run(self, slot: _Slot, request: ExecuteRequest) -> ToolOutput:
        async with slot.lock:
            context = SlotContext(slot.workspace, slot.allow_network, self.max_output_chars, self.require_isolation)
            started, clock = time.time(), time.monotonic()
            output = await run_operation(request.call_id, request.operation, context)
            self._executions.record(
                call_id=request.call_id,
                slot=slot.index,
                op=request.operation.op,
                started=started,
                duration=time.monotonic() - clock,
                exit_code=output.exit_code,
            )
            stored = StoredResult(call_id=request.call_id, slot=slot.index, lease_id=request.lease_id, output=output)
            self._journal.put(stored)
        if slot.lease and slot.lease.lease_id == request.lease_id:
            self._renew(slot)
        return output

    async def _outcome(self, task: asyncio.Task[ToolOutput]) -> ToolOutput:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not task.cancelled() or (current and current.cancelling()):
                raise
            if self._closing:
                raise SandboxUnreachable("the sandbox server stopped while the operation ran") from None
            raise LeaseLost("the slot was released or reset while the operation ran") from None

    def _leased(self, index: int, lease_id: str, ttl_s: float | None = None) -> _Slot:
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

    def _renew(self, slot: _Slot) -> None:
        assert slot.lease is not None
        slot.lease = slot.lease.model_copy(update={"expires_at": time.time() + slot.ttl_s})
        self._save_leases()

    def _grant(
        self, slot: _Slot, holder: Holder, ttl_s: float, allow_network: bool, lease_id: str | None = None
    ) -> SlotLease:
        slot.lease = SlotLease(
            container_id=self.container_id,
            slot=slot.index,
            lease_id=lease_id or uuid.uuid4().hex,
            holder=holder,
            expires_at=time.time() + ttl_s,
        )
        slot.ttl_s, slot.allow_network = ttl_s, allow_network
        self._save_leases()
        return slot.lease

    def _hand_over(self, slot: _Slot) -> None:
        if slot.free:
            self._line.serve_next(lambda waiter: self._grant(slot, waiter.holder, waiter.ttl_s, waiter.allow_network))

    def _give_back(self, lease: SlotLease) -> None:
        slot = self._slots[lease.slot]
        if slot.lease and slot.lease.lease_id == lease.lease_id:
            self._spawn(self._retire(slot, reset=True))

    def _retire(self, slot: _Slot, *, reset: bool) -> asyncio.Task[None]:
        """Take the lease away now; kill what runs, reset and hand the slot on in a task."""
        slot.lease, slot.resetting = None, True
        self._save_leases()
        return self._spawn(self._reset_and_hand_over(slot, reset))

    async def _reset_and_hand_over(self, slot: _Slot, reset: bool) -> None:
        try:
            for task in list(slot.running):
                task.cancel()
            await asyncio.gather(*slot.running, return_exceptions=True)
            if reset:
                async with slot.lock:
                    await asyncio.to_thread(clear_directory, slot.workspace)
        except Exception:
            log.exception("resetting slot %d failed; handing it on as it is", slot.index)
        finally:
            slot.resetting = False
            self._hand_over(slot)

    def _expire_lapsed(self) -> None:
        now = time.time()
        for slot in self._slots:
            if slot.lease and slot.lease.expires_at <= now and not slot.running:
                log.info("lease %s on slot %d lapsed; resetting the slot", slot.lease.lease_id, slot.index)
                self._retire(slot, reset=True)

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

    def _restore_leases(self) -> None:
        now = time.time()
        for stored in self._lease_store.load():
            index = stored.lease.slot
            mine = stored.lease.container_id == self.container_id and 0 <= index < len(self._slots)
            if mine and stored.lease.expires_at > now:
                slot = self._slots[index]
                slot.lease, slot.ttl_s, slot.allow_network = stored.lease, stored.ttl_s, stored.allow_network

    def _save_leases(self) -> None:
        self._lease_store.save(
            [StoredLease(lease=s.lease, ttl_s=s.ttl_s, allow_network=s.allow_network) for s in self._slots if s.lease]
        )
