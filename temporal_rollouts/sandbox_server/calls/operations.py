"""The four slot operations (exec, read_file, write_file, search), each turned into a ToolOutput.

Problems the model caused with a well-formed request (a missing file, a failing
command, no matches) come back as outputs it can read, with ok=False where the
operation failed; requests the server must refuse (a path outside the workspace)
raise BadToolRequest instead.
"""

from __future__ import annotations

import asyncio
import dataclasses
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.sandbox_server.files.cache import SharedCache
from temporal_rollouts.sandbox_server.errors import BadToolRequest
from temporal_rollouts.sandbox_server.files.beneath import ToolPath, describe, refused
from temporal_rollouts.sandbox_server.files.disk_usage import Passed, describe_passed
from temporal_rollouts.sandbox_server.files.image_root import SlotRoot
from temporal_rollouts.sandbox_server.volumes.disk_watch import DiskWatch
from temporal_rollouts.sandbox_server.files.workspace import read_text, write_text
from temporal_rollouts.sandbox_server.isolation.bubblewrap import SlotSandbox, isolation_mode, run_command
from temporal_rollouts.sandbox_server.isolation.launcher import Launcher
from temporal_rollouts.sandbox_server.schema import ExecOp, Operation, ReadFileOp, SearchOp, ToolOutput, WriteFileOp
from temporal_rollouts.sandbox_server.volumes.slot_volume import SlotVolume

OverLimit = Callable[[int, Passed], Awaitable[None]]
"""(slot index, the limit it passed): what to do when a check finds a slot past a limit."""
SEARCH_TIMEOUT_S = 30.0
SEARCH_LINE_CHARS = 400


@dataclass(frozen=True)
class SlotContext:
    """What one operation works with: the slot's sandbox, taken whole, and what the server adds to it."""

    sandbox: SlotSandbox
    max_output_chars: int
    cache: SharedCache | None = None
    launcher: Launcher | None = None
    """The slot's resident launcher (`launcher`), for an ExecOp or a SearchOp that asked for it."""
    disk: DiskWatch | None = None
    """What the slot's workspace holds and when it is walked; None: walked after every operation."""
    volume: SlotVolume | None = None
    """Where the slot's files live (`slot_volume`); None: no disk or file limit is checked."""
    over_limit: OverLimit | None = None
    """Called when an operation finds the slot past a disk or file limit: it stops the slot's processes."""
    tool_path: Callable[[str], ToolPath] = ToolPath.parse
    """A tool's path in this slot (`Slot.tool_path`): under /workspace, or on an item image under `/`."""
    root: SlotRoot | None = None
    """The slot's root on an item image (`Slot.root`), for a verifier's pristine root; None: the server's own."""

    @property
    def workspace(self) -> Path:
        return self.sandbox.workspace

    @property
    def owner(self) -> tuple[int, int] | None:
        """Who host-side writes must leave files to: the slot's uid when the server runs as root."""
        c, slot = self.sandbox.confinement, self.sandbox.slot
        return (c.uid(slot), c.gid(slot)) if c is not None and c.dedicated_uids else None


async def run_operation(call_id: str, operation: Operation, slot: SlotContext) -> ToolOutput:
    started = time.monotonic()
    if isinstance(operation, ExecOp):
        output = await _exec(call_id, operation, slot)
    elif isinstance(operation, ReadFileOp):
        output = await _read_file(call_id, operation, slot)
    elif isinstance(operation, WriteFileOp):
        output = await _write_file(call_id, operation, slot)
    elif isinstance(operation, SearchOp):
        output = await _search(call_id, operation, slot)
    else:
        raise BadToolRequest(f"unknown operation {operation!r}")
    if not output.duration_s:
        output.duration_s = time.monotonic() - started
    return output


async def _exec(call_id: str, op: ExecOp, slot: SlotContext) -> ToolOutput:
    if op.timeout_s <= 0:
        raise BadToolRequest("timeout_s must be positive")
    if op.verifier is not None:
        raise BadToolRequest("a verifier command is run by `calls.verifier`, not as a plain command")
    if op.cache and slot.cache is None:
        raise BadToolRequest("this sandbox has no shared cache")
    if op.read_only and isolation_mode(slot.sandbox.require_isolation) != "bubblewrap":
        raise BadToolRequest("a read-only workspace needs bubblewrap, and this server runs commands unisolated")
    cache = [slot.cache.path(name) for name in dict.fromkeys(op.cache)] if slot.cache is not None else []
    result = await run_command(
        op.command,
        slot.sandbox,
        timeout_s=op.timeout_s,
        max_output_chars=slot.max_output_chars,
        cache=cache,
        launcher=slot.launcher,
        read_only=op.read_only,
    )
    output = result.output
    # A read-only command changed nothing: no walk (its mount refuses setuid bits and new bytes alike).
    over_disk = "" if op.read_only else await settle_after_command(slot, result.duration_s, result.bits_refused)
    if over_disk:
        output += over_disk
    return ToolOutput(
        call_id=call_id,
        ok=result.exit_code == 0 and not result.timed_out and not over_disk,
        output=output,
        exit_code=result.exit_code,
        timed_out=result.timed_out,
        truncated=result.truncated,
        duration_s=result.duration_s,
    )


async def _read_file(call_id: str, op: ReadFileOp, slot: SlotContext) -> ToolOutput:
    path = slot.tool_path(op.path)
    try:
        text, truncated = await asyncio.to_thread(read_text, slot.workspace, path, slot.max_output_chars)
    except FileNotFoundError:
        return _failed(call_id, f"file not found: {path.shown}")
    except IsADirectoryError:
        return _failed(call_id, f"{path.shown} is a directory, not a file")
    except OSError as err:
        if refused(err):
            raise BadToolRequest(f"cannot read {path.shown}: {describe(err)}") from None
        return _failed(call_id, f"cannot read {path.shown}: {describe(err)}")
    return ToolOutput(call_id=call_id, ok=True, output=text, truncated=truncated)


async def _write_file(call_id: str, op: WriteFileOp, slot: SlotContext) -> ToolOutput:
    path = slot.tool_path(op.path)
    if over_disk := await _over_disk(slot, len(op.content.encode("utf-8", errors="surrogateescape"))):
        return _failed(call_id, f"cannot write {path.shown}:{over_disk}")
    try:
        written = await asyncio.to_thread(write_text, slot.workspace, path, op.content, slot.owner)
    except IsADirectoryError:
        return _failed(call_id, f"cannot write {path.shown}: it is a directory")
    except OSError as err:
        if refused(err):
            raise BadToolRequest(f"cannot write {path.shown}: {describe(err)}") from None
        return _failed(call_id, f"cannot write {path.shown}: {describe(err)}")
    if slot.disk is not None:
        slot.disk.wrote(written)
    return ToolOutput(call_id=call_id, ok=True, output=f"wrote {written} bytes to {path.shown}")


async def _search(call_id: str, op: SearchOp, slot: SlotContext) -> ToolOutput:
    if not op.pattern:
        raise BadToolRequest("search pattern is empty")
    if op.max_matches < 1:
        raise BadToolRequest("max_matches must be at least 1")
    path = slot.tool_path(op.path)  # grep runs in the sandbox, which resolves the path in the slot's own view
    where = [path.shown] if path.mount == "/" else [path.relative] if path.parts else []
    argv = ["grep", "-rnHIsP", "--color=never", "-e", op.pattern, "--", *where]
    result = await run_command(
        shlex.join(argv),
        dataclasses.replace(slot.sandbox, allow_network=False),  # grep needs no network, whatever the lease allows
        timeout_s=SEARCH_TIMEOUT_S,
        max_output_chars=slot.max_output_chars,
        launcher=slot.launcher,
    )
    if result.timed_out:
        return _failed(call_id, f"search timed out after {SEARCH_TIMEOUT_S:.0f}s", timed_out=True)
    if result.exit_code == 1:
        return ToolOutput(call_id=call_id, ok=True, output="no matches", exit_code=1)
    if result.exit_code != 0:
        return _failed(call_id, result.output.strip() or "search failed", exit_code=result.exit_code)
    lines = [_shorten(line) for line in result.output.splitlines()]
    truncated = result.truncated or len(lines) > op.max_matches
    shown = lines[: op.max_matches]
    if len(lines) > op.max_matches:
        shown.append(f"[... more than {op.max_matches} matches, refine the pattern or path ...]")
    return ToolOutput(call_id=call_id, ok=True, output="\n".join(shown), exit_code=0, truncated=truncated)


async def settle_after_command(slot: SlotContext, ran_s: float, bits_refused: bool) -> str:
    """After a command ran for `ran_s`: a notice when the workspace is past one of the slot's limits (whose
    processes are then stopped, `SlotManager.over_limit`), else "". A volume of its own is measured (one
    statfs); a checked one is walked when a walk is due, and the walk strips setuid and setgid bits after
    every command that could set them (`bits_refused` False): `disk_watch` says when."""
    if slot.volume is None or slot.sandbox.confinement is None:
        return ""
    watch = slot.disk if slot.disk is not None else DiskWatch()
    limits = slot.sandbox.confinement.limits
    usage = await watch.after(slot.volume, ran_s, bits_refused=bits_refused, limits=limits)
    passed, stop = watch.judge(usage, slot.volume, limits)
    if passed is None:
        return ""
    if stop and slot.over_limit is not None:
        await slot.over_limit(slot.sandbox.slot, passed)
    return _limit_notice(slot, passed)


async def _over_disk(slot: SlotContext, adding: int) -> str:
    """A notice when the workspace, with `adding` more bytes and one more file, would be past a limit, else ""."""
    if slot.volume is None or slot.sandbox.confinement is None:
        return ""
    limits = slot.sandbox.confinement.limits
    watch = slot.disk if slot.disk is not None else DiskWatch()
    usage = await watch.after(slot.volume, 0.0, bits_refused=True, limits=limits)  # the server writes no such bits
    grown = dataclasses.replace(
        usage,
        bytes=usage.bytes + adding,
        files=usage.files + 1,
        free_bytes=None if usage.free_bytes is None else usage.free_bytes - adding,
    )
    passed = grown.passed(limits, slot.volume.files_limit(limits))
    return "" if passed is None else _limit_notice(slot, passed)


def _limit_notice(slot: SlotContext, passed: Passed) -> str:
    assert slot.volume is not None and slot.sandbox.confinement is not None
    limits = slot.sandbox.confinement.limits
    limit = describe_passed(passed, limits, slot.volume.files_limit(limits))
    return f"\n[sandbox: the workspace is past {limit}; delete files before writing more]"


def _shorten(line: str) -> str:
    return line if len(line) <= SEARCH_LINE_CHARS else line[:SEARCH_LINE_CHARS] + " [...]"


def _failed(call_id: str, message: str, **fields: object) -> ToolOutput:
    return ToolOutput(call_id=call_id, ok=False, output=message, **fields)
