"""Running operations in slots, at most once per call id.

Split from the slot manager so that leasing (who may use a slot) and running (what
happens in it) can be read apart. Every result is stored by call id, so a retried
call, even one sent to a restarted server process, is answered from the store.
A call whose server died while it ran has no stored result and runs again when
retried: commands must tolerate that, as they tolerate any crash.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from temporal_rollouts.sandbox_server.calls.verifier import run_verifier
from temporal_rollouts.sandbox_server.files.cache import SharedCache
from temporal_rollouts.sandbox_server.volumes.disk_watch import DiskWatch
from temporal_rollouts.sandbox_server.errors import LeaseLost, SandboxUnreachable
from temporal_rollouts.sandbox_server.config import ContainerConfig
from temporal_rollouts.sandbox_server.isolation.bubblewrap import SlotSandbox, setuid_bits_refused
from temporal_rollouts.sandbox_server.isolation.launcher import SlotLaunchers
from temporal_rollouts.sandbox_server.limits.confinement import Confinement, SlotLimits
from temporal_rollouts.sandbox_server.calls.operations import (
    OverLimit,
    SlotContext,
    run_operation,
    settle_after_command,
)
from temporal_rollouts.sandbox_server.state.persistence import ExecutionLog, ResultJournal, StoredResult
from temporal_rollouts.sandbox_server.schema import (
    ExecOp,
    ExecuteRequest,
    SearchOp,
    SessionOp,
    SlotLease,
    StopProcessesOp,
    ToolOutput,
)
from temporal_rollouts.sandbox_server.calls.sessions import SlotSessions
from temporal_rollouts.sandbox_server.files.beneath import ToolPath
from temporal_rollouts.sandbox_server.files.image_root import SlotRoot
from temporal_rollouts.sandbox_server.volumes.slot_volume import SlotVolume


@dataclass
class Slot:
    index: int
    volume: SlotVolume
    """Where the slot's files live, held to its disk and file limits (`slot_volume`)."""
    lease: SlotLease | None = None
    ttl_s: float = 0.0
    allow_network: bool = False
    resetting: bool = False
    quarantined: str | None = None
    """Why the slot could not be reset; a quarantined slot is never leased until a reset succeeds."""
    limits: SlotLimits | None = None
    """This lease's narrower limits (`SlotManager.narrow`); None: the server's."""
    running: set[asyncio.Task[ToolOutput]] = field(default_factory=set)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    disk: DiskWatch = field(default_factory=DiskWatch)
    """What the workspace holds and when it is walked; changed by uploads and copies, renewed by a reset."""
    notices: list[str] = field(default_factory=list)
    """What the server did to the slot between calls (its processes stopped at a limit), for the next result."""
    stopping: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Held while the slot's processes are stopped for a limit: nothing of the slot starts meanwhile, so the
    kill (which goes on until the slot's cgroups stay empty) never takes the next command's sandbox."""
    root: SlotRoot | None = None
    """The slot's root on the server's item image (`image_root`); None: the server's own root."""

    @property
    def free(self) -> bool:
        return self.lease is None and not self.resetting and self.quarantined is None

    @property
    def workspace(self) -> Path:
        """The folder the slot's commands and file tools work in: its workspace, mounted at /workspace; on an
        item image its whole root, `/`."""
        return self.root.path if self.root is not None else self.volume.workspace

    def tool_path(self, path: str) -> ToolPath:
        """A tool's path in this slot: under /workspace, or on an item image anywhere under `/`, a relative one
        from the image's WORKDIR."""
        if self.root is None:
            return ToolPath.parse(path)
        return ToolPath.parse(path, "/", tuple(part for part in self.root.image.workdir.split("/") if part))

    @property
    def folder(self) -> Path:
        """The server's folder of the slot (its uid claim, its terminal's record, spools): never in the volume."""
        return self.volume.folder

    def take_notices(self) -> str:
        notes, self.notices = self.notices, []
        return "".join(f"\n[sandbox: {note}]" for note in dict.fromkeys(notes))


class CallRunner:
    config: ContainerConfig

    def __init__(self, config: ContainerConfig, confinement: Confinement, cache: SharedCache | None = None) -> None:
        self.config = config
        self.cache = cache
        self.confinement = confinement
        self.closing = False
        self.over_limit: OverLimit | None = None
        """Called when an operation finds the slot past its disk or file limit (`SlotManager` stops its processes)."""
        self._journal = ResultJournal(config.root / "results.jsonl", limit=config.results_kept)
        self._executions = ExecutionLog(config.root / "executions.jsonl")
        self._inflight: dict[str, asyncio.Task[ToolOutput]] = {}
        self.sessions = SlotSessions(config)
        self.launchers = SlotLaunchers()

    def sandbox_of(self, slot: Slot) -> SlotSandbox:
        """Where and as whom the slot's commands run now: its workspace (its root on an item image), the
        server's confinement narrowed to this lease's limits, the lease's network."""
        return SlotSandbox(
            slot.workspace,
            slot.index,
            self.confinement.with_limits(slot.limits),
            slot.allow_network,
            self.config.require_isolation,
        )

    def close_files(self) -> None:
        self._journal.close()
        self._executions.close()

    async def execute(self, slot: Slot, request: ExecuteRequest, ran: Callable[[Slot, str], None]) -> ToolOutput:
        """Run one operation in a slot already checked to be leased under `request.lease_id`, or answer
        a repeated call id from its stored result; `ran(slot, lease_id)` is called after a real run."""
        if (stored := self._journal.get(request.call_id)) is not None:
            return stored.model_copy(update={"replayed": True})
        if (first := self._inflight.get(request.call_id)) is not None:
            output = await self._outcome(first)
            return output.model_copy(update={"replayed": True})
        task = asyncio.create_task(self._run(slot, request, ran))
        self._inflight[request.call_id] = task
        slot.running.add(task)

        def forget(done: asyncio.Task[ToolOutput]) -> None:
            self._inflight.pop(request.call_id, None)
            slot.running.discard(done)

        task.add_done_callback(forget)
        return await self._outcome(task)

    async def _run(self, slot: Slot, request: ExecuteRequest, ran: Callable[[Slot, str], None]) -> ToolOutput:
        async with slot.lock:
            async with slot.stopping:  # a stop for a limit in progress ends before anything of the slot starts
                pass
            sandbox = self.sandbox_of(slot)
            operation, launcher = request.operation, None
            resident = (
                isinstance(operation, ExecOp) and operation.resident and not operation.cache and not operation.read_only
            ) or (isinstance(operation, SearchOp) and operation.resident)
            if resident:  # the agent's own commands (its terminal calls, its searches); hooks' get their own sandboxes
                launcher = await self.launchers.for_command(sandbox, request.lease_id)
            context = SlotContext(
                sandbox,
                self.config.max_output_chars,
                self.cache,
                launcher,
                slot.disk,
                slot.volume,
                self.over_limit,
                slot.tool_path,
                slot.root,
            )
            started, clock = time.time(), time.monotonic()
            if isinstance(request.operation, SessionOp):
                output = await self.sessions.run(sandbox, request.lease_id, request.call_id, request.operation)
                ran_s, refused = time.monotonic() - clock, setuid_bits_refused()
                if over_disk := await settle_after_command(context, ran_s, refused):
                    output = output.model_copy(update={"output": output.output + over_disk, "ok": False})
            elif isinstance(request.operation, StopProcessesOp):
                output = await self._stop_processes(slot, request.call_id, sandbox.confined)
            elif isinstance(request.operation, ExecOp) and request.operation.verifier is not None:
                output = await run_verifier(request.call_id, request.operation, request.operation.verifier, context)
            else:
                output = await run_operation(request.call_id, request.operation, context)
            if notices := slot.take_notices():
                output = output.model_copy(update={"output": output.output + notices})
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
        ran(slot, request.lease_id)
        return output

    async def _stop_processes(self, slot: Slot, call_id: str, confinement: Confinement) -> ToolOutput:
        """End every process of the slot (`StopProcessesOp`); the slot's lock is held, so none of its
        operations runs meanwhile, and the next command starts in a sandbox of its own."""
        await self.sessions.stop(slot.index)
        await self.launchers.stop(slot.index)
        left = await asyncio.to_thread(confinement.kill_slot, slot.index)
        left += await asyncio.to_thread(confinement.kill_uid, slot.index)
        said = f"{left} left running were killed" if left else "none was left running"
        return ToolOutput(call_id=call_id, ok=True, output=f"stopped every process of the slot ({said})")

    async def _outcome(self, task: asyncio.Task[ToolOutput]) -> ToolOutput:
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not task.cancelled() or (current and current.cancelling()):
                raise
            if self.closing:
                raise SandboxUnreachable("the sandbox server stopped while the operation ran") from None
            raise LeaseLost("the slot was released or reset while the operation ran") from None
