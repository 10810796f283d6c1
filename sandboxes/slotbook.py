"""SlotBook: the record a sandbox server keeps of its slots: leases on disk, events, idleness.

Kept apart from the SlotManager's logic (who gets which slot, when) so that every
change of state is written down the same way: persisted leases survive a restart
of the process, the event log feeds measurements, and `idle_since` tells the pool
when a container may be stopped.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from sandboxes.execution import Slot
from sandboxes.lease_log import LeaseLog
from sandboxes.persistence import LeaseStore, StoredLease
from sandboxes.schema import Holder, LeaseEvent, LeaseEventKind, SlotLease
from sandboxes.waitline import WaitLine


class SlotBook:
    def __init__(self, root: Path, slots: int, container_id: str, line: WaitLine) -> None:
        self.container_id = container_id
        self.slots = [Slot(index, root / f"slot-{index}" / "workspace") for index in range(slots)]
        for slot in self.slots:
            slot.workspace.mkdir(parents=True, exist_ok=True)
        self.idle_since: float | None = None
        self._line = line
        self._store = LeaseStore(root / "leases.json")
        self._events = LeaseLog(root)
        self._restore()
        self.update_idle()

    def held_by(self, holder: Holder) -> Slot | None:
        return next((slot for slot in self.slots if slot.lease and slot.lease.holder == holder), None)

    def free_count(self) -> int:
        """Slots without a lease (one being reset counts: nobody works in it)."""
        return sum(slot.lease is None for slot in self.slots)

    def snapshot(self) -> dict[str, Any]:
        """Time, line length and free count now, for an event written later."""
        return {"t": time.time(), "waiters": len(self._line), "free": self.free_count()}

    def update_idle(self) -> None:
        if len(self._line) > 0 or any(slot.lease for slot in self.slots):
            self.idle_since = None
        elif self.idle_since is None:
            self.idle_since = time.time()

    def record(
        self,
        event: LeaseEventKind,
        *,
        slot: int | None = None,
        lease: SlotLease | None = None,
        holder: Holder | None = None,
        **fields: Any,
    ) -> None:
        self.update_idle()
        fields = {**self.snapshot(), **fields}
        lease_id, holder = (lease.lease_id, lease.holder) if lease else (None, holder)
        self._events.record(LeaseEvent(event=event, slot=slot, lease_id=lease_id, holder=holder, **fields))

    def save(self) -> None:
        self._store.save(
            [StoredLease(lease=s.lease, ttl_s=s.ttl_s, allow_network=s.allow_network) for s in self.slots if s.lease]
        )

    def _restore(self) -> None:
        now = time.time()
        for stored in self._store.load():
            index = stored.lease.slot
            mine = stored.lease.container_id == self.container_id and 0 <= index < len(self.slots)
            if mine and stored.lease.expires_at > now:
                slot = self.slots[index]
                slot.lease, slot.ttl_s, slot.allow_network = stored.lease, stored.ttl_s, stored.allow_network
