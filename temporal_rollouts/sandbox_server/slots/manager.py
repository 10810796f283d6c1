"""SlotManager: the slots of one sandbox container, leased to rollouts and worked on by call id.

The HTTP server is a thin wrapper around this class, and this class is the authority
for its slots: leases are persisted, so a restarted process keeps them. A slot is
leased to one holder at a time; waiters are served first come, first served the
moment a slot is handed back. A waiter can be withdrawn by ticket, or leaves when
its caller goes away, so a dead client never keeps a place in line nor receives a
slot. Leases that are not renewed lapse (checked on every operation and by a
background sweeper) and their slot is reset and handed on. Every change is written
to the lease event log (see `temporal_rollouts.sandbox_server.state.lease_log`).

Each slot's files live in its volume (`slot_volume`), held to its disk and file limits; a check
that finds a slot past one (after a call, or the disk guard between calls) stops every process
of the slot (`over_limit`). A reset makes the volume afresh in constant time, whatever the agent
built: a new filesystem (made ahead while the lease runs), or the old workspace moved aside and
deleted in the background. A slot whose reset fails is quarantined: reported in /health and
/slots with why, never leased, tried again after 1 s and then less and less often, and never a
reason for the server not to start.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import os
import time
import uuid
from collections.abc import Coroutine
from typing import Any, NamedTuple

from temporal_rollouts.sandbox_server.isolation import bubblewrap
from temporal_rollouts.sandbox_server.isolation.reaper import reap_orphans
from temporal_rollouts.sandbox_server.files.cache import SharedCache
from temporal_rollouts.sandbox_server.slots.disk_guard import guard_disks
from temporal_rollouts.sandbox_server.files.disk_usage import Passed, describe_passed
from temporal_rollouts.sandbox_server.volumes.disk_watch import DiskWatch
from temporal_rollouts.sandbox_server.errors import BadToolRequest, LeaseLost, SandboxRequired, SlotUnavailable
from temporal_rollouts.sandbox_server.calls.execution import CallRunner, Slot
from temporal_rollouts.sandbox_server.files.workspace import give_tree, remove_tree
from temporal_rollouts.sandbox_server.config import ContainerConfig, SlotLimits
from temporal_rollouts.sandbox_server.files.image_root import ImageRoot, SlotRoot
from temporal_rollouts.sandbox_server.limits.confinement import Confinement
from temporal_rollouts.sandbox_server.harness import SlotHarnesses
from temporal_rollouts.sandbox_server.schema import (
    DrainResult,
    ExecuteRequest,
    HarnessAnswered,
    HarnessAnswerRequest,
    HarnessNext,
    HarnessNextRequest,
    HarnessStartRequest,
    HarnessState,
    HarnessStopRequest,
    HealthStatus,
    Holder,
    LeaseEventKind,
    ReleaseResult,
    SlotLease,
    SlotLimitsRequest,
    SlotState,
    ToolOutput,
)
from temporal_rollouts.sandbox_server.volumes.slot_volume import (
    Leftover,
    SlotVolume,
    SlotVolumes,
    slot_folder,
)
from temporal_rollouts.sandbox_server.slots.slotbook import SlotBook
from temporal_rollouts.sandbox_server.isolation.uids import UidClaims, save_uid, saved_uid
from temporal_rollouts.sandbox_server.slots.waitline import Waiter, WaitLine
from temporal_rollouts.sandbox_server.limits.watchdog import SlotRule, Watchdog

log = logging.getLogger(__name__)

QUARANTINE_FIRST_RETRY_S = 1.0
QUARANTINE_RETRY_S = 60.0
"""A quarantined slot's reset is tried again after 1 s, then after twice as long each time, at most this."""


class Grant(NamedTuple):
    lease: SlotLease
    fresh: bool
    """False when the holder already had this lease: giving it back would take a slot it uses."""


class SlotManager:
    config: ContainerConfig
    """What this container's slots start with, whole: nothing here copies its fields."""
    cache: SharedCache
    """Shared by the slots, read-only to them; survives reset and release (`sandbox_server.files.cache`)."""

    def __init__(self, config: ContainerConfig) -> None:
        self.config = config
        # Cgroups are named after the container and its slot folder: a server restarted in place finds its
        # own (and kills what was left in them), two servers never share one.
        cgroup_name = f"{config.container_id}-{hashlib.sha256(str(config.root.resolve()).encode()).hexdigest()[:8]}"
        self.confinement = Confinement.detect(
            config.limits, config.slot_uid_base, cgroup_name, config.use_cgroups, config.slot_uid_count
        )
        self.confinement.image = ImageRoot.from_config(config)
        self._claims: UidClaims | None = None
        self._line = WaitLine()
        self.volumes = SlotVolumes("checked", "not chosen yet")  # `start` chooses the best this host allows
        volumes = [
            SlotVolume(slot_folder(config.root, index), "checked", self.confinement.limits)
            for index in range(config.slots_per_container)
        ]
        self._book = SlotBook(config.root, volumes, config.container_id, self._line)
        self._slots = self._book.slots
        if (image := self.confinement.image) is not None:  # every slot's root is the image with its own layer over it
            for slot in self._slots:
                slot.root = SlotRoot(image, slot.folder)
                slot.volume.layered = True
        self.cache = SharedCache(config.root)
        self._runner = CallRunner(config, self.confinement, self.cache)
        self._runner.over_limit = self.over_limit
        self.harnesses = SlotHarnesses()
        self._quarantine_retry: dict[int, tuple[float, float]] = {}
        """slot -> (when its reset is tried again, the wait before that)."""
        self._background: set[asyncio.Task[Any]] = set()
        self._sweeper: asyncio.Task[None] | None = None
        self._guard: asyncio.Task[None] | None = None
        self._making_spares: set[int] = set()
        self._clearing: set[asyncio.Task[None]] = set()
        self._closing = False
        self._draining = False

    async def start(self) -> None:
        """Claim the slots' uids, reset workspaces no live lease owns (left by an earlier process) and
        start the sweeper.

        A slot that cannot be reset is quarantined; it never stops the server from starting."""
        if self.isolation_mode == "none":
            if self.config.require_isolation:
                log.error("bubblewrap is missing and isolation is required: every command will be refused")
            else:
                bubblewrap.warn_unisolated()  # on every start, not once per process
        if self.config.allow_network_unprotected:
            log.warning(
                "slots leased with network on share this host's network: they can reach every service it "
                "can (Temporal, sandbox servers, storage, policy servers). allow_network_unprotected is set."
            )
        if self.confinement.dedicated_uids and bubblewrap.bubblewrap_strategy() == "userns":
            top = self.config.root.resolve()
            blocked = [str(p) for p in [top, *top.parents] if not os.stat(p).st_mode & 0o001]
            if blocked:
                log.error("slots run bubblewrap as their own uid, but others cannot search %s: commands fail", blocked)
        if self.isolation_mode == "bubblewrap":  # tried once now, so a refused filter is logged at start
            await asyncio.to_thread(bubblewrap.setuid_bits_refused)
        if self.confinement.image is not None and (problem := self.confinement.image.problem()):
            raise SandboxRequired(problem)
        moved = await asyncio.to_thread(self._claim_uids) if self.confinement.dedicated_uids else {}
        await asyncio.to_thread(self._prepare_cgroups)
        if self.confinement.unwatched_limits():
            self.confinement.watchdog = Watchdog(self._watch_rule)
            self.confinement.watchdog.start()
        self.volumes = await asyncio.to_thread(
            SlotVolumes.choose, self.config.root, self.confinement.limits, len(self._slots), self.config.slot_volume
        )
        for slot in self._slots:
            slot.volume.kind = self.volumes.kind
        for slot in self._slots:
            if slot.lease is not None:
                await asyncio.to_thread(self._keep_volume, slot, moved.get(slot.index))
        await asyncio.gather(*(self._reset(s) for s in self._slots if s.free))
        for slot in self._slots:
            self._spawn(self._empty_trash(slot))
        self._sweeper = asyncio.create_task(self._sweep_forever())
        self._guard = asyncio.create_task(
            guard_disks(
                self._slots, self._limits_of, lambda s: self.confinement.has_processes(s.index), self.over_limit
            )
        )

    def _prepare_cgroups(self) -> None:
        for slot in self._slots:
            try:
                self.confinement.prepare_slot(slot.index)
            except OSError as err:
                log.warning("cannot set up cgroups for slot %d (%s); limits fall back to rlimits", slot.index, err)
                self.confinement.cgroups = None
                return

    def _claim_uids(self) -> dict[int, int]:
        """One uid per slot that no other slot on this host holds, the one it had before where it can.
        Returns the leased slots whose uid changed, with the uid their workspace still belongs to."""
        c = self.confinement
        self._claims = UidClaims(self.config.uid_claims_dir, c.uid_base, c.uid_count)
        moved = {}
        for slot in self._slots:
            before = saved_uid(slot.folder)
            uid = c.slot_uids[slot.index] = self._claims.claim(before)
            save_uid(slot.folder, uid)
            if before is not None and before != uid and slot.lease is not None:
                log.warning(
                    "slot %d's uid %d is held elsewhere now; its workspace moves to uid %d", slot.index, before, uid
                )
                moved[slot.index] = before
        return moved

    def _watch_rule(self, index: int) -> SlotRule:
        """What the watchdog holds a slot to: this lease's limits, those no cgroup holds."""
        confinement = self.confinement.with_limits(self._slots[index].limits)
        unwatched = confinement.unwatched_limits()
        return SlotRule(
            uid=confinement.uid(index) if confinement.dedicated_uids else None,
            memory_bytes=confinement.limits.memory_bytes if "memory" in unwatched else 0,
            cpus=confinement.limits.cpus if "cpus" in unwatched else 0.0,
        )

    def _owner(self, slot: Slot) -> tuple[int, int] | None:
        c = self.confinement
        return (c.uid(slot.index), c.gid(slot.index)) if c.dedicated_uids else None

    def _keep_volume(self, slot: Slot, old_uid: int | None) -> None:
        """A slot leased before this process started: its volume as it was, given to the uid it has now."""
        try:
            if (leftover := slot.volume.prepare(self._owner(slot), keep=True)) is not None:
                leftover()
            if old_uid is not None and (owner := self._owner(slot)) is not None:
                give_tree(slot.volume.tree, old_uid, owner)
            self._mount_root(slot)
        except OSError as err:
            slot.quarantined = f"its volume cannot be mounted again: {err}"[:500]
            log.error("slot %d is quarantined: %s", slot.index, slot.quarantined)

    def _mount_root(self, slot: Slot) -> None:
        """On an item image: mount the slot's root, the image under the slot's own layer (made where missing)."""
        if slot.root is None:
            return
        upper, work = slot.volume.make_layer(self._owner(slot))
        slot.root.mount(upper, work, self.confinement.uid(slot.index))

    def _limits_of(self, slot: Slot) -> SlotLimits:
        return slot.limits or self.confinement.limits

    async def over_limit(self, index: int, passed: Passed) -> None:
        """A check found the slot past a disk or file limit: stop every process it runs (its commands, its
        terminal, what they left in the background), and say so in its next result."""
        slot = self._slots[index]
        async with slot.stopping:
            killed = await asyncio.to_thread(self.confinement.stop_slot, index)
        limit = describe_passed(passed, self._limits_of(slot), slot.volume.files_limit(self._limits_of(slot)))
        log.warning("slot %d passed %s: stopped its processes (%d signalled)", index, limit, killed)
        slot.notices.append(
            f"the slot passed {limit}: every process it ran was stopped (its commands, its terminal and what ran "
            "in the background); delete files to go on"
        )

    async def _reset(self, slot: Slot) -> bool:
        """Kill what the slot left running and empty its workspace; quarantine the slot if that fails."""
        try:
            await asyncio.to_thread(self.confinement.kill_slot, slot.index)
            if self.confinement.watchdog is not None:
                self.confinement.watchdog.forget(slot.index)
            if slot.limits is not None:  # the next lease starts from the server's limits
                slot.limits = None
                await asyncio.to_thread(self.confinement.prepare_slot, slot.index)
            slot.notices.clear()
            if slot.root is not None:  # its processes are gone: the root can go, and the layer under it
                await asyncio.to_thread(slot.root.unmount)
            leftover = await asyncio.to_thread(slot.volume.reset, self._owner(slot), self.confinement.limits)
            await asyncio.to_thread(self._mount_root, slot)
            slot.disk = DiskWatch()
        except Exception as err:  # noqa: BLE001  (whatever stops a reset, the slot must not be handed on)
            slot.quarantined = f"reset failed: {type(err).__name__}: {err}"[:500]
            log.error("slot %d cannot be reset and is quarantined: %s", slot.index, slot.quarantined)
            self._spawn(self._empty_trash(slot))  # what it moved aside before failing: the next try needs the room
            return False
        if slot.quarantined:
            log.info("slot %d was reset and leaves quarantine", slot.index)
        slot.quarantined = None
        if leftover is not None:
            clearing = asyncio.create_task(self._clear(leftover))  # not cancelled at close: it releases a device
            self._clearing.add(clearing)
            clearing.add_done_callback(self._clearing.discard)
        if slot.index not in self._making_spares and not self._closing:
            self._making_spares.add(slot.index)
            self._spawn(self._make_spare(slot))
        return True

    async def _make_spare(self, slot: Slot) -> None:
        """The filesystem of the slot's next reset, made while this lease runs (`SlotVolume.make_spare`)."""
        try:
            await asyncio.to_thread(slot.volume.make_spare, self.confinement.limits)
        except OSError as err:  # the next reset makes its own, and says so if it cannot
            log.warning("cannot make slot %d's next volume ahead: %s", slot.index, err)
        finally:
            self._making_spares.discard(slot.index)

    async def _clear(self, leftover: Leftover) -> None:
        """What a reset left to do, off the hand-over: tear the old filesystem down, or delete the old tree."""
        try:
            await asyncio.to_thread(leftover)
        except Exception:
            log.exception("cannot clear what a slot's reset left")

    async def _empty_trash(self, slot: Slot) -> None:
        for trash in await asyncio.to_thread(slot.volume.leftover_trash):
            await self._clear(functools.partial(remove_tree, trash))

    async def close(self) -> None:
        """Stop the sweeper, kill running operations and turn waiters away; leases stay persisted."""
        if self._closing:
            return
        self._closing = self._runner.closing = True
        for task in (self._sweeper, self._guard):
            if task:
                task.cancel()
        self._line.turn_away(SlotUnavailable("the sandbox server is shutting down"))
        running = [task for slot in self._slots for task in slot.running] + list(self._background)
        for task in running:
            task.cancel()
        await asyncio.gather(*running, *(t for t in [self._sweeper, self._guard] if t), return_exceptions=True)
        await asyncio.gather(*self._clearing, return_exceptions=True)
        await self._runner.sessions.close()
        await self._runner.launchers.close()
        await self.harnesses.close()
        if self.confinement.watchdog is not None:
            await self.confinement.watchdog.stop()
        for slot in self._slots:
            await asyncio.to_thread(self.confinement.remove_slot, slot.index)
            try:
                if slot.root is not None:
                    await asyncio.to_thread(slot.root.release)
                await asyncio.to_thread(slot.volume.release)
            except OSError as err:
                log.warning("cannot unmount slot %d's volume: %s", slot.index, err)
        if self._claims is not None:
            self._claims.close()
        self._runner.close_files()

    async def __aenter__(self) -> SlotManager:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def isolation_mode(self) -> bubblewrap.IsolationMode:
        return "bubblewrap" if bubblewrap.bubblewrap_path() else "none"

    def health(self) -> HealthStatus:
        self._expire_lapsed()
        return HealthStatus(
            container_id=self.config.container_id,
            slots=len(self._slots),
            free=sum(slot.free for slot in self._slots),
            waiters=len(self._line),
            isolation=self.isolation_mode,
            idle_since=self._book.idle_since,
            draining=self._draining,
            require_isolation=self.config.require_isolation,
            quarantined={s.index: s.quarantined for s in self._slots if s.quarantined},
            limits={
                **self.confinement.in_force(bubblewrap.bubblewrap_sizes_tmpfs() and self.isolation_mode != "none"),
                **self.volumes.describe(self.confinement.limits),
                "setuid_bits": "refused-in-agent-sandboxes"
                if bubblewrap.setuid_bits_refused()
                else "stripped-after-command",
            },
            not_held={**self.confinement.not_held(), **self.volumes.not_held(self.confinement.limits)},
            network="refused"
            if not self.config.allow_network_unprotected
            else "host network (control plane reachable)",
            slot_limits=self.confinement.limits,
            slot_uids=dict(self.confinement.slot_uids),
            uid_range=(c.uid_base, c.uid_base + c.uid_count - 1) if (c := self.confinement).dedicated_uids else None,
            image=self.confinement.image.name if self.confinement.image is not None else None,
        )

    def slot_states(self) -> list[SlotState]:
        self._expire_lapsed()
        return [
            SlotState(slot=s.index, lease=s.lease, busy=bool(s.running), quarantined=s.quarantined) for s in self._slots
        ]

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
            raise SlotUnavailable(f"sandbox {self.config.container_id} is draining to stop and takes no new leases")
        if allow_network and not self.config.allow_network_unprotected:
            raise SandboxRequired(
                "a slot with network on would share the sandbox host's network and could reach the control "
                "plane (Temporal, sandbox servers, storage, policy servers); this server refuses network-on "
                "slots unless sandbox.allow_network_unprotected acknowledges that risk"
            )
        self._expire_lapsed()
        if (held := self._book.held_by(holder)) is not None:
            return Grant(self._grant(held, holder, ttl_s, allow_network, reuse=True), False)
        if not len(self._line) and (slot := next((s for s in self._slots if s.free), None)):
            return Grant(self._grant(slot, holder, ttl_s, allow_network), True)
        if wait_s == 0:
            raise SlotUnavailable(f"no slot of sandbox {self.config.container_id} is free")
        served = await self._line.wait(
            holder, ttl_s, allow_network, wait_s, give_back=self.give_back, ticket=ticket, notify=self._waiter_moved
        )
        if served is None:
            raise SlotUnavailable(f"no slot of sandbox {self.config.container_id} became free within {wait_s:g}s")
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
            self._line.turn_away(SlotUnavailable(f"sandbox {self.config.container_id} is draining to stop"))
        return DrainResult(draining=self._draining, idle_since=idle_since)

    def renew(self, slot: int, lease_id: str, ttl_s: float) -> SlotLease:
        if ttl_s <= 0:
            raise BadToolRequest("ttl_s must be positive")
        leased = self._leased(slot, lease_id, ttl_s)
        assert leased.lease is not None
        return leased.lease

    async def release(self, slot: int, lease_id: str, reset: bool = True, reason: str = "released") -> ReleaseResult:
        """Give a slot back (idempotent): released=False when the lease was already gone. The slot is always
        reset before anyone else gets it (`reset=False` is accepted for old clients and ignored)."""
        self._expire_lapsed()
        if not 0 <= slot < len(self._slots):
            return ReleaseResult(released=False)
        target = self._slots[slot]
        if target.lease is None or target.lease.lease_id != lease_id:
            return ReleaseResult(released=False)
        kind: LeaseEventKind = "reaped" if reason == "reaped" else "released"
        # `reset` is not honoured: a slot is never handed on with what its last holder left in it.
        await asyncio.shield(self._retire(target, reset=True, kind=kind))
        return ReleaseResult(released=True)

    async def narrow(self, slot: int, lease_id: str, requested: SlotLimitsRequest) -> SlotLimitsRequest:
        """Lower the leased slot's limits for this lease (never above the server's); returns those in force.
        They last until the slot is released; a restarted server applies its own limits again."""
        target = self._leased(slot, lease_id)
        current = target.limits or self.confinement.limits
        narrowed = current.narrowed(requested)
        async with target.lock:
            await asyncio.to_thread(self.confinement.with_limits(narrowed).prepare_slot, target.index)
            target.limits = narrowed
            resized = (narrowed.disk_bytes, narrowed.max_files) != (current.disk_bytes, current.max_files)
            # An empty volume of its own, whose filesystem no sandbox has bound yet, is made again at the narrower
            # size; otherwise its usage is checked against it.
            if resized and not self.confinement.has_processes(target.index):
                if await asyncio.to_thread(self._remake, target, narrowed):
                    target.disk = DiskWatch()
        return SlotLimitsRequest(**narrowed.model_dump())

    def _remake(self, slot: Slot, limits: SlotLimits) -> bool:
        """`SlotVolume.remake` for a lease's narrower limits, the slot's root (on an image) unmounted around it."""
        if slot.root is not None:
            slot.root.unmount()
        try:
            return slot.volume.remake(self._owner(slot), limits)
        finally:
            self._mount_root(slot)

    async def execute(self, request: ExecuteRequest) -> ToolOutput:
        """Run one operation in a leased slot, or answer a repeated call id from its stored result."""
        slot = self._leased(request.slot, request.lease_id)
        return await self._runner.execute(slot, request, self._ran)

    async def start_harness(self, request: HarnessStartRequest) -> HarnessState:
        """Run a harness as the slot's agent (`harness`), in the lease's confinement, its bundle from the cache."""
        slot = self._leased(request.slot, request.lease_id)
        return await self.harnesses.start(
            request,
            folder=slot.folder / "harness",
            sandbox=self._runner.sandbox_of(slot),
            bundle=self.cache.path(request.bundle) if request.bundle else None,
        )

    async def next_harness_request(self, request: HarnessNextRequest) -> HarnessNext:
        self._leased(request.slot, request.lease_id)
        return await self.harnesses.next(request)

    def answer_harness_request(self, request: HarnessAnswerRequest) -> HarnessAnswered:
        self._leased(request.slot, request.lease_id)
        return self.harnesses.answer(request)

    async def stop_harness(self, request: HarnessStopRequest) -> HarnessState:
        self._leased(request.slot, request.lease_id)
        return await self.harnesses.stop(request.slot, request.harness_id, request.lease_id)

    def owner(self, index: int) -> tuple[int, int] | None:
        """Who files placed in a slot by the server must belong to: its uid when the server runs as root."""
        c = self.confinement
        return (c.uid(index), c.gid(index)) if c.dedicated_uids else None

    def leased_slot(self, index: int, lease_id: str) -> Slot:
        """The slot leased under `lease_id` (renewing the lease), for work beside `execute`: transfers."""
        return self._leased(index, lease_id)

    def _ran(self, slot: Slot, lease_id: str) -> None:
        if slot.lease and slot.lease.lease_id == lease_id:
            self._renew(slot)

    def _leased(self, index: int, lease_id: str, ttl_s: float | None = None) -> Slot:
        if not 0 <= index < len(self._slots):
            raise BadToolRequest(f"sandbox {self.config.container_id} has no slot {index}")
        slot = self._slots[index]
        # This slot's lease only: a pass over every slot on each call cost 80-150 us at 2,000 slots; the
        # sweeper (and every acquire) still retires the others' lapsed leases.
        self._expire_if_lapsed(slot, time.time())
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
            container_id=self.config.container_id,
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
            await self._runner.sessions.stop(slot.index)  # the lease ended: so does its terminal
            await self._runner.launchers.stop(slot.index)  # and its launcher
            await self.harnesses.stop_slot(slot.index)  # and its harness
            if reset:
                async with slot.lock:
                    await self._reset(slot)
        except BaseException as err:
            if not isinstance(err, asyncio.CancelledError) or not self._closing:
                slot.quarantined = slot.quarantined or f"reset interrupted: {type(err).__name__}"
            raise
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
            self._expire_if_lapsed(slot, now)

    def _expire_if_lapsed(self, slot: Slot, now: float) -> None:
        if slot.lease and slot.lease.expires_at <= now and not slot.running:
            log.info("lease %s on slot %d lapsed; resetting the slot", slot.lease.lease_id, slot.index)
            self._retire(slot, reset=True, kind="expired")

    async def _sweep_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.sweep_interval_s)
            try:
                self._expire_lapsed()
                reap_orphans()  # a sandbox's init that ended after its command did
                await self._retry_quarantined()
            except Exception:
                log.exception("lease sweep failed")

    async def _retry_quarantined(self) -> None:
        """Try again to reset quarantined slots (whatever blocked it may have gone: a full disk whose trash is
        now deleted, a fault), soon at first, then less and less often."""
        now = time.monotonic()
        for slot in self._slots:
            if not slot.quarantined or slot.lease is not None or slot.resetting:
                self._quarantine_retry.pop(slot.index, None)
                continue
            due, wait = self._quarantine_retry.get(slot.index, (0.0, QUARANTINE_FIRST_RETRY_S / 2))
            if now < due:
                continue
            wait = min(wait * 2, QUARANTINE_RETRY_S)
            self._quarantine_retry[slot.index] = (now + wait, wait)
            await self._empty_trash(slot)
            async with slot.lock:
                if await self._reset(slot):
                    self._book.update_idle()
                    self._hand_over(slot)

    def _spawn(self, coroutine: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task
