"""The stateful terminal: one long-lived shell per slot whose directory, variables and background processes last.

One-shot commands kill everything they started when they end (`bubblewrap`). Agent
tasks also need a shell that stays: a server started in the background that a later
call talks to, a `cd`, an activated venv. So a slot may have one session: bash in a
pseudo-terminal (util-linux `script` provides it, so Ctrl-C and job control work as
at a keyboard), started through `bubblewrap.command_launch` like every command, hence
inside the same sandbox, limits and network policy; only its lifetime differs.

The server reads the session's output all the time into a bounded buffer with
absolute offsets: `run` answers the output of one command (the shell prints a marker
with the exit status after it), `send_keys` and `read` the output since the last read,
`screen` the last lines as a person would see them (escape sequences dropped; no full
terminal emulation, so a full-screen program shows as its recent output).

A session ends when the slot is released, reset or its lease expires. Its existence is
also written beside the workspace (`session.json`), so a server that restarted after a
crash can tell a call for the session it lost that the session is gone, with what was
lost, instead of silently starting a new shell in which the model's `cd` and servers
are missing. Results are stored by call id like every operation (`execution.py`), so a
retried call is answered from the store and never typed into the shell twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import secrets
import shlex
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import BadToolRequest, SandboxLaunchFailed
from temporal_rollouts.sandbox_server.config import ContainerConfig
from temporal_rollouts.sandbox_server.isolation.bubblewrap import SlotSandbox, start_sandboxed
from temporal_rollouts.sandbox_server.limits.confinement import Confinement
from temporal_rollouts.sandbox_server.files.output import BoundedOutput
from temporal_rollouts.sandbox_server.schema import SessionOp, ToolOutput
from temporal_rollouts.sandbox_server.volumes.slot_volume import slot_folder

log = logging.getLogger(__name__)

SHELL = "bash --noprofile --norc --noediting -i"
LAUNCH = f"exec script --quiet --flush --return --command {shlex.quote(SHELL)} /dev/null"
ROWS, COLUMNS = 50, 200
SETUP = f"stty -echo -onlcr rows {ROWS} cols {COLUMNS} 2>/dev/null; PS1=''; PS2=''; PROMPT_COMMAND=''; unset HISTFILE"
BUFFER_BYTES = 1024 * 1024
"""Output kept per session; older output is gone from `read` and `screen` (a `run` notes the cut)."""
START_TIMEOUT_S = 15.0
SETTLE_S = 0.3
INTERRUPT_GRACE_S = 1.0
SCREEN_LINES = 40
SCREEN_BYTES = 64 * 1024
READ_CHUNK = 64 * 1024
OFF_LOOP_BYTES = 16 * 1024
MARKER = re.compile(rb"\x1e([0-9a-f]{16}):(-?\d+)\x1e")
CURSOR_MOVES = re.compile("([\r\b])")
ESCAPES = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")
KEY_NAMES = {
    "Enter": "\r",
    "C-m": "\r",
    "Tab": "\t",
    "Escape": "\x1b",
    "BSpace": "\x7f",
    "Space": " ",
    "C-c": "\x03",
    "C-d": "\x04",
    "C-z": "\x1a",
    "C-l": "\x0c",
    "C-u": "\x15",
    "C-a": "\x01",
    "C-e": "\x05",
    "Up": "\x1b[A",
    "Down": "\x1b[B",
    "Right": "\x1b[C",
    "Left": "\x1b[D",
}
SESSION_FILE = "session.json"
SESSION_PART = "session"
"""The session's own cgroup under the slot's: one-shot commands end theirs, never this one."""


@dataclass
class Session:
    process: asyncio.subprocess.Process
    lease_id: str
    buffer: bytearray = field(default_factory=bytearray)
    start: int = 0
    """Absolute offset of `buffer[0]`: output before it was dropped."""
    read_mark: int = 0
    screen_from: int = 0
    """Where the screen begins: after the shell's own setup."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    pump: asyncio.Task[None] | None = None
    confinement: Confinement | None = None
    """The limits it was started under: its part of the slot's cgroup ends with it, and so does the watch."""
    watching: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def end(self) -> int:
        return self.start + len(self.buffer)

    @property
    def alive(self) -> bool:
        return self.process.returncode is None

    def take(self, since: int, until: int | None = None) -> tuple[bytes, bool]:
        """Output between two absolute offsets, and whether its beginning was already dropped."""
        until = self.end if until is None else until
        lost = since < self.start
        return bytes(self.buffer[max(since, self.start) - self.start : until - self.start]), lost

    def feed(self, chunk: bytes) -> None:
        self.buffer += chunk
        if len(self.buffer) > BUFFER_BYTES:
            drop = len(self.buffer) - BUFFER_BYTES
            del self.buffer[:drop]
            self.start += drop
        self.changed.set()

    async def output_after(self, offset: int, timeout_s: float) -> bool:
        """Wait until output passes `offset` (or the shell ends); False on timeout."""
        deadline = time.monotonic() + timeout_s
        while self.end <= offset and self.alive:
            self.changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)
        return True

    def write(self, data: str | bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data.encode() if isinstance(data, str) else data)


class SlotSessions:
    """The sessions of one server's slots, by slot index. A session is only ever used under its slot's lock."""

    config: ContainerConfig
    """Its output cap, and the server's root: each session's record is kept in its slot's folder, never in
    the slot's volume (where a full disk would keep it from being written)."""

    def __init__(self, config: ContainerConfig) -> None:
        self.config = config
        self._sessions: dict[int, Session] = {}

    @staticmethod
    def _where(sandbox: SlotSandbox) -> str:
        """Where a new session starts: /workspace, or on an item image its WORKDIR."""
        image = sandbox.confinement.image if sandbox.confinement is not None else None
        return image.workdir if image is not None else "/workspace"

    def _record(self, index: int) -> Path:
        return slot_folder(self.config.root, index) / SESSION_FILE

    async def run(self, sandbox: SlotSandbox, lease_id: str, call_id: str, op: SessionOp) -> ToolOutput:
        """One action of the slot's session; `sandbox`: this lease's, with its (narrowed) limits, for a new session."""
        index = sandbox.slot
        started = time.monotonic()
        session = self._sessions.get(index)
        record = self._record(index)
        if session is not None and session.lease_id != lease_id:  # a release that never reached us
            await self.stop(index)
            session = None
        if session is not None and not session.alive:
            code = session.process.returncode
            await self.stop(index)
            if op.action != "start":
                return _failed(
                    call_id,
                    f"the terminal session ended: its shell exited with status {code}. "
                    "Its directory, variables and background processes are gone; "
                    "call again to start a new session.",
                )
            session = None
        lost = _lost_session(record, lease_id) if session is None else None
        if lost:
            record.unlink(missing_ok=True)
            if op.action not in ("start", "stop"):
                return _failed(call_id, lost)
        if op.action == "stop":
            stopped = session is not None
            await self.stop(index)
            return ToolOutput(
                call_id=call_id,
                ok=True,
                output="stopped the terminal session" if stopped else "no terminal session was running",
            )
        if session is None:
            session = await self._start(sandbox, lease_id)
            if op.action == "start":
                note = f"{lost}\n" if lost else ""
                return ToolOutput(
                    call_id=call_id, ok=True, output=f"{note}started a terminal session in {self._where(sandbox)}"
                )
        elif op.action == "start":
            return ToolOutput(call_id=call_id, ok=True, output="the terminal session is already running")
        if op.timeout_s <= 0:
            raise BadToolRequest("timeout_s must be positive")
        if op.action == "run":
            output = await self._run_command(session, call_id, op)
        elif op.action == "send_keys":
            output = await self._send_keys(session, call_id, op)
        elif op.action == "read":
            output = await self._read(session, call_id)
        else:
            shown, _ = session.take(max(session.screen_from, session.start, session.end - SCREEN_BYTES))
            output = ToolOutput(call_id=call_id, ok=True, output=await asyncio.to_thread(_screen, shown))
        if not session.alive:  # the command ended the shell (`exit`): say so now, start afresh next time
            code = session.process.returncode
            await self.stop(index)
            note = f"[the shell exited with status {code}: the session is over; the next call starts a new one]"
            output.output = f"{output.output.rstrip()}\n{note}".lstrip()
            if op.action == "run":
                output.ok, output.exit_code, output.timed_out = code == 0, code, False
        output.duration_s = time.monotonic() - started
        return output

    async def stop(self, index: int, *, forget: bool = True) -> None:
        """Kill the session's sandbox and everything in it. `forget=False` keeps its record, so a server
        that comes back (this one is shutting down) reports the session as lost instead of unknown."""
        session = self._sessions.pop(index, None)
        if forget:
            self._record(index).unlink(missing_ok=True)
        if session is None:
            return
        _kill_group(session.process.pid)
        with contextlib.suppress(ProcessLookupError):
            await session.process.wait()
        session.watching.close()
        if session.confinement is not None:
            await asyncio.to_thread(session.confinement.end_part, index, SESSION_PART)
        if session.pump is not None:
            session.pump.cancel()
            await asyncio.gather(session.pump, return_exceptions=True)

    async def close(self) -> None:
        for index in list(self._sessions):
            await self.stop(index, forget=False)

    async def _start(self, sandbox: SlotSandbox, lease_id: str) -> Session:
        index, confinement = sandbox.slot, sandbox.confinement
        process = await start_sandboxed(
            ["bash", "-c", LAUNCH],
            sandbox,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            part=SESSION_PART,
            filtered=True,
        )
        session = Session(process=process, lease_id=lease_id, confinement=confinement)
        if confinement is not None:
            session.watching.enter_context(confinement.watched(index, process.pid))
        session.pump = asyncio.create_task(_pump(session))
        self._sessions[index] = session
        nonce = secrets.token_hex(8)
        session.write(f"{SETUP}; printf '\\036%s:%d\\036' {nonce} 0\n")
        if not await _wait_for_marker(session, 0, nonce, START_TIMEOUT_S):
            text, _ = session.take(0)
            await self.stop(index)
            raise SandboxLaunchFailed(f"the terminal session did not start: {text.decode(errors='replace')[-500:]}")
        session.read_mark = session.screen_from = session.end
        record = {"lease_id": lease_id, "server_pid": os.getpid(), "started_at": time.time()}
        self._record(index).write_text(json.dumps(record))
        return session

    async def _run_command(self, session: Session, call_id: str, op: SessionOp) -> ToolOutput:
        if not op.text.strip():
            raise BadToolRequest("the command is empty")
        nonce = secrets.token_hex(8)
        begin = session.end
        session.write(op.text.rstrip("\n") + "\n" + f"printf '\\036%s:%d\\036' {nonce} \"$?\"\n")
        found = await _wait_for_marker(session, begin, nonce, op.timeout_s)
        if found is None and not session.alive:
            text, truncated = await self._capped(session.take(begin))
            return ToolOutput(call_id=call_id, ok=False, output=text, truncated=truncated)
        if found is None:
            session.write(b"\x03")  # as at a keyboard: interrupt the foreground command, drop typed-ahead input
            await asyncio.sleep(INTERRUPT_GRACE_S)
            end = session.end
            text, truncated = await self._capped(session.take(begin, end))
            text = text.strip("\n")
            session.read_mark = end
            note = f"[still running after {op.timeout_s:g}s: sent Ctrl-C; background processes keep running]"
            return ToolOutput(
                call_id=call_id,
                ok=False,
                output=f"{text}\n{note}" if text else note,
                timed_out=True,
                truncated=truncated,
            )
        marker_at, marker_end, status = found
        text, truncated = await self._capped(session.take(begin, marker_at))
        session.read_mark = marker_end
        return ToolOutput(call_id=call_id, ok=status == 0, output=text, exit_code=status, truncated=truncated)

    async def _send_keys(self, session: Session, call_id: str, op: SessionOp) -> ToolOutput:
        if not op.text:
            raise BadToolRequest("no keys to send")
        session.write(KEY_NAMES.get(op.text.strip(), op.text))
        deadline = time.monotonic() + op.timeout_s
        seen = session.end
        while time.monotonic() < deadline:  # until the output settles, or the wait is over
            await session.output_after(seen, min(SETTLE_S, max(deadline - time.monotonic(), 0)))
            if session.end == seen:
                break
            seen = session.end
        return await self._read(session, call_id)

    async def _read(self, session: Session, call_id: str) -> ToolOutput:
        end = session.end
        text, truncated = await self._capped(session.take(session.read_mark, end))
        session.read_mark = end
        return ToolOutput(call_id=call_id, ok=True, output=text or "(no new output)", truncated=truncated)

    async def _capped(self, taken: tuple[bytes, bool]) -> tuple[str, bool]:
        data, lost = taken
        if len(data) > OFF_LOOP_BYTES:  # up to a megabyte of output: rendered in a thread, the server keeps answering
            text, truncated = await asyncio.to_thread(_render_capped, data, self.config.max_output_chars)
        else:
            text, truncated = _render_capped(data, self.config.max_output_chars)
        if lost:
            text = "[... earlier output dropped ...]\n" + text
        return text, truncated or lost


def _render_capped(data: bytes, max_chars: int) -> tuple[str, bool]:
    output = BoundedOutput(max_chars)
    output.feed(MARKER.sub(b"", data))
    text, truncated = output.text()
    return _plain(text), truncated


async def _pump(session: Session) -> None:
    assert session.process.stdout is not None
    try:
        while chunk := await session.process.stdout.read(READ_CHUNK):
            session.feed(chunk)
    finally:
        await session.process.wait()
        session.changed.set()


async def _wait_for_marker(session: Session, begin: int, nonce: str, timeout_s: float) -> tuple[int, int, int] | None:
    """(start, end, status) of this nonce's marker in the output after `begin`, or None on timeout."""
    deadline = time.monotonic() + timeout_s
    scanned = begin
    while True:
        data, _ = session.take(max(begin, scanned - 64))
        offset = max(begin, scanned - 64, session.start)
        for match in MARKER.finditer(data):
            if match.group(1).decode() == nonce:
                return offset + match.start(), offset + match.end(), int(match.group(2))
        scanned = session.end
        remaining = deadline - time.monotonic()
        if remaining <= 0 or not session.alive and session.end == scanned:
            return None
        await session.output_after(scanned, remaining)


def _lost_session(record: Path, lease_id: str) -> str | None:
    """Why this lease's session is gone, if the record says it had one that this server does not hold."""
    try:
        saved = json.loads(record.read_text())
    except (OSError, ValueError):
        return None
    if saved.get("lease_id") != lease_id:
        return None
    if saved.get("server_pid") != os.getpid():
        why = "the sandbox server restarted (its container or process crashed or was stopped)"
    else:
        why = "it was stopped"
    return (
        f"the terminal session was lost: {why}. Its working directory, variables and background "
        "processes are gone; its files remain. Call again to start a new session."
    )


def _screen(data: bytes) -> str:
    lines = _plain(MARKER.sub(b"", data).decode("utf-8", errors="replace")).split("\n")
    shown = "\n".join(lines[-SCREEN_LINES:]).rstrip()
    return shown or "(the screen is empty)"


def _plain(text: str) -> str:
    """Text as it would stand on a screen: escape sequences dropped, carriage returns and backspaces
    applied as a terminal applies them (they move the cursor; what follows overwrites). Linear in the
    text's length, whatever mix of control characters it holds."""
    text = ESCAPES.sub("", text)
    return "\n".join(_render_line(line) for line in text.replace("\r\n", "\n").split("\n"))


def _render_line(line: str) -> str:
    if "\r" not in line and "\b" not in line:
        return line
    cells: list[str] = []
    cursor = 0
    for piece in CURSOR_MOVES.split(line):
        if piece == "\r":
            cursor = 0
        elif piece == "\b":
            cursor = max(cursor - 1, 0)
        elif piece:
            cells[cursor : cursor + len(piece)] = piece
            cursor += len(piece)
    return "".join(cells)


def _failed(call_id: str, message: str) -> ToolOutput:
    return ToolOutput(call_id=call_id, ok=False, output=message)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
