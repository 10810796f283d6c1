"""What a sandbox server keeps on disk so that a restarted process carries on.

Stored results let a retried tool call be answered without running it again,
even by a new server process; persisted leases keep the slots of running
rollouts theirs across the restart; the execution log records every operation
that really ran, which is how tests prove nothing ran twice.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from collections import OrderedDict
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from temporal_rollouts.sandbox_server.schema import SlotLease, ToolOutput

log = logging.getLogger(__name__)


def write_json_atomically(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            json.dump(data, file)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


class AppendFile:
    """A journal file kept open for appending, unbuffered: a line costs one write(2), not an open, a write
    and a close (every tool call appends two lines). A crash can lose or tear only the last line.

    Opened when made, so a disk whose inodes ran out later cannot keep it from being created. A line the
    disk has no room for is dropped with a warning (the caller keeps what it holds in memory): a full disk
    must never turn a tool call that ran into a server error, which its retry would run again."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd: int | None = None
        self._failing = False
        with contextlib.suppress(OSError):
            self._open()

    def append(self, line: str) -> bool:
        """Append one line; False (and a warning, once while it lasts) when the disk refused it."""
        try:
            fd = self._open()
            data = memoryview(line.encode("utf-8"))
            while data:
                data = data[os.write(fd, data) :]
        except OSError as err:
            if not self._failing:
                log.warning("cannot append to %s (%s): lines are kept in memory only", self.path, err)
            self._failing = True
            return False
        self._failing = False
        return True

    def _open(self) -> int:
        if self._fd is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o666)
        return self._fd

    def close(self) -> None:
        """Before the file is replaced (a compaction) and at shutdown; the next line opens it again."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class StoredResult(BaseModel):
    call_id: str
    slot: int
    lease_id: str
    output: ToolOutput


class ResultJournal:
    """The most recent results by call id (at most `limit` of them and about `max_chars` of output),
    appended to a JSONL file as they are stored and compacted when the file grows past twice that."""

    def __init__(self, path: Path, limit: int = 10_000, max_chars: int = 64_000_000) -> None:
        self.path = path
        self.limit = limit
        self.max_chars = max_chars
        self._results: OrderedDict[str, StoredResult] = OrderedDict()
        self._chars = 0
        self._lines_in_file = 0
        self._chars_in_file = 0
        self._file = AppendFile(path)
        self._load()

    def get(self, call_id: str) -> ToolOutput | None:
        stored = self._results.get(call_id)
        return stored.output.model_copy() if stored else None

    def put(self, record: StoredResult) -> None:
        self._remember(record)
        self._file.append(record.model_dump_json() + "\n")
        self._lines_in_file += 1
        self._chars_in_file += len(record.output.output)
        if self._lines_in_file > 2 * self.limit or self._chars_in_file > 2 * self.max_chars:
            self._compact()

    def __len__(self) -> int:
        return len(self._results)

    def close(self) -> None:
        self._file.close()

    def _remember(self, record: StoredResult) -> None:
        if (replaced := self._results.pop(record.call_id, None)) is not None:
            self._chars -= len(replaced.output.output)
        self._results[record.call_id] = record
        self._chars += len(record.output.output)
        while len(self._results) > 1 and (len(self._results) > self.limit or self._chars > self.max_chars):
            _, evicted = self._results.popitem(last=False)
            self._chars -= len(evicted.output.output)

    def _load(self) -> None:
        if not self.path.exists():
            return
        damaged = False
        with self.path.open("r", encoding="utf-8", errors="replace") as file:
            for line in file:
                self._lines_in_file += 1
                self._chars_in_file += len(line)
                try:
                    self._remember(StoredResult.model_validate_json(line))
                except ValidationError:
                    damaged = True
                damaged = damaged or not line.endswith("\n")
        if damaged:
            log.warning("result journal %s had damaged lines; they were dropped", self.path)
        if damaged or self._lines_in_file > len(self._results):
            self._compact()

    def _compact(self) -> None:
        self._file.close()
        temporary = self.path.with_name(self.path.name + ".tmp")
        try:
            with temporary.open("w", encoding="utf-8") as file:
                for record in self._results.values():
                    file.write(record.model_dump_json() + "\n")
            os.replace(temporary, self.path)
        except OSError as err:  # a full disk: the journal stays as it was, and grows again once there is room
            log.warning("cannot compact %s: %s", self.path, err)
            temporary.unlink(missing_ok=True)
            return
        self._lines_in_file = len(self._results)
        self._chars_in_file = self._chars


class ExecutionLog:
    """One JSON line per operation that really ran (replays are not logged)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = AppendFile(path)

    def close(self) -> None:
        self._file.close()

    def record(
        self, *, call_id: str, slot: int, op: str, started: float, duration: float, exit_code: int | None
    ) -> None:
        entry = {
            "call_id": call_id,
            "slot": slot,
            "op": op,
            "started": started,
            "duration": round(duration, 6),
            "exit_code": exit_code,
        }
        self._file.append(json.dumps(entry) + "\n")


class StoredLease(BaseModel):
    lease: SlotLease
    ttl_s: float
    allow_network: bool


LEASE_FILE = "lease_book.jsonl"


class LeaseStore:
    """The live leases of one server, as an append-only journal: one line per lease written
    (`put`: a grant, or an expiry moved ahead) and per lease ended (`drop`), rewritten to one
    line per live lease by `compact`. Appending keeps a grant or a release one short write,
    however many slots the server has. A torn last line (a crash mid-write) is skipped."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines = 0
        """Lines in the file, for the caller to decide when to compact."""

    def load(self) -> list[StoredLease]:
        """The live leases, the latest written for each slot."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return []
        live: dict[int, StoredLease] = {}
        self.lines = 0
        for line in text.splitlines():
            self.lines += 1
            try:
                entry = json.loads(line)
                if "put" in entry:
                    stored = StoredLease.model_validate(entry["put"])
                    live[stored.lease.slot] = stored
                elif "drop" in entry:
                    live = {slot: s for slot, s in live.items() if s.lease.lease_id != entry["drop"]}
            except (ValueError, ValidationError, TypeError):
                log.warning("lease journal %s has a damaged line; it was skipped", self.path)
        return list(live.values())

    def put(self, stored: StoredLease) -> None:
        self._append({"put": stored.model_dump(mode="json")})

    def drop(self, lease_id: str) -> None:
        self._append({"drop": lease_id})

    def compact(self, leases: list[StoredLease]) -> None:
        try:
            write_lines_atomically(self.path, [json.dumps({"put": s.model_dump(mode="json")}) for s in leases])
        except OSError as err:  # a full disk: the journal stays as it was
            log.warning("cannot compact %s: %s", self.path, err)
            return
        self.lines = len(leases)

    def _append(self, entry: dict[str, Any]) -> None:
        """One line; on a full disk a warning instead: the lease holds in memory, and only a restart before
        the disk has room again would forget it (its holder then gets LeaseLost, never another's slot)."""
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as file:
                file.write(json.dumps(entry) + "\n")
        except OSError as err:
            log.warning("cannot append to %s: %s", self.path, err)
            return
        self.lines += 1


def write_lines_atomically(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.writelines(line + "\n" for line in lines)
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise
