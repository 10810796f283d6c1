"""SlotBook: the record a sandbox server keeps of its slots: leases on disk, events, idleness.

Kept apart from the SlotManager's logic (who gets which slot, when) so that every
change of state is written down the same way: persisted leases survive a restart
of the process, the event log feeds measurements, and `idle_since` tells the pool
when a container may be stopped.

Leases are kept in an append-only journal (`temporal_rollouts.sandbox_server.state.persistence.LeaseStore`): a
grant or a release appends one line instead of rewriting every live lease. Renewals
are the frequent change (every operation renews its lease), so the journal holds
each lease with an expiry written ahead of the real one, by a quarter of its TTL, and
a renewal writes only once the real expiry has passed the written one. What a
restart restores is then never an expiry earlier than the real one (a live lease is
never dropped) and at most a quarter TTL later.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from temporal_rollouts.sandbox_server.calls.execution import Slot
from temporal_rollouts.sandbox_server.state.lease_log import LeaseLog
from temporal_rollouts.sandbox_server.state.persistence import LEASE_FILE, LeaseStore, StoredLease
from temporal_rollouts.sandbox_server.schema import Holder, LeaseEvent, LeaseEventKind, SlotLease
from temporal_rollouts.sandbox_server.volumes.slot_volume import SlotVolume
from temporal_rollouts.sandbox_server.slots.waitline import WaitLine

SAVE_AHEAD = 0.25
"""How far ahead of a lease's real expiry its saved expiry lies, as a share of its TTL."""
COMPACT_LINES = 1024
"""The lease journal is rewritten once it has this many lines and four times as many as live leases."""


class SlotBook:
    def __init__(self, root: Path, volumes: list[SlotVolume], container_id: str, line: WaitLine) -> None:
        self.container_id = container_id
        self.slots = [Slot(index, volume) for index, volume in enumerate(volumes)]
        for slot in self.slots:
            slot.folder.mkdir(parents=True, exist_ok=True)
        self.idle_since: float | None = None
        self._line = line
        self._store = LeaseStore(root / LEASE_FILE)
        self._saved_until: dict[str, float] = {}  # lease id -> the expiry the lease file holds for it
        self._events = LeaseLog(root)
        self._restore()
        self.update_idle()

    def held_by(self, holder: Holder) -> Slot | None:
        return next((slot for slot in self.slots if slot.lease and slot.lease.holder == holder), None)

    def free_count(self) -> int:
        """Slots without a lease (one being reset counts: nobody works in it; a quarantined one does not)."""
        return sum(slot.lease is None and slot.quarantined is None for slot in self.slots)

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

    def granted(self, slot: Slot) -> None:
        """After a grant (or a lease given again to its holder): write it, expiry ahead."""
        assert slot.lease is not None
        written = slot.lease.expires_at + SAVE_AHEAD * slot.ttl_s
        self._saved_until[slot.lease.lease_id] = written
        stored = StoredLease(
            lease=slot.lease.model_copy(update={"expires_at": written}),
            ttl_s=slot.ttl_s,
            allow_network=slot.allow_network,
        )
        self._store.put(stored)
        self._compact_if_long()

    def renewed(self, slot: Slot) -> None:
        """After a renewal: write only if the lease now outlives the expiry the journal holds."""
        assert slot.lease is not None
        if slot.lease.expires_at > self._saved_until.get(slot.lease.lease_id, -1.0):
            self.granted(slot)

    def ended(self, lease: SlotLease) -> None:
        """After a release, an expiry or a reap."""
        self._saved_until.pop(lease.lease_id, None)
        self._store.drop(lease.lease_id)
        self._compact_if_long()

    def _compact_if_long(self) -> None:
        live = [slot for slot in self.slots if slot.lease]
        if self._store.lines >= COMPACT_LINES and self._store.lines >= 4 * len(live):
            self._compact(live)

    def _compact(self, live: list[Slot]) -> None:
        stored = []
        for slot in live:
            assert slot.lease is not None
            written = max(self._saved_until.get(slot.lease.lease_id, -1.0), slot.lease.expires_at)
            self._saved_until[slot.lease.lease_id] = written
            stored.append(
                StoredLease(
                    lease=slot.lease.model_copy(update={"expires_at": written}),
                    ttl_s=slot.ttl_s,
                    allow_network=slot.allow_network,
                )
            )
        self._store.compact(stored)

    def _restore(self) -> None:
        now = time.time()
        for stored in self._store.load():
            index = stored.lease.slot
            mine = stored.lease.container_id == self.container_id and 0 <= index < len(self.slots)
            if mine and stored.lease.expires_at > now:
                slot = self.slots[index]
                slot.lease, slot.ttl_s, slot.allow_network = stored.lease, stored.ttl_s, stored.allow_network
                self._saved_until[stored.lease.lease_id] = stored.lease.expires_at
        self._compact([slot for slot in self.slots if slot.lease])  # drops a torn last line before anything appends
