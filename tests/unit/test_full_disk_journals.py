"""A full disk never turns a tool call that ran into a server error: the server's journals degrade to memory.

On the issue's fresh server a slot had taken every inode, `executions.jsonl` could not be created and
`echo` answered 500, which a retry would have run again.
"""

from __future__ import annotations

import errno
import os

import pytest

from temporal_rollouts.sandbox_server.state import persistence
from temporal_rollouts.sandbox_server.state.persistence import ExecutionLog, LeaseStore, ResultJournal, StoredResult
from temporal_rollouts.sandbox_server.schema import Holder, SlotLease, ToolOutput


@pytest.fixture
def full_disk(monkeypatch):
    """Every write the server's journals try fails with ENOSPC; reading still works."""

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    opened = persistence.Path.open

    def open_to_read_only(path, mode="r", *args, **kwargs):
        return refuse() if set(mode) & set("wax+") else opened(path, mode, *args, **kwargs)

    monkeypatch.setattr(persistence.os, "write", refuse)
    monkeypatch.setattr(persistence.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(persistence.Path, "open", open_to_read_only)


def test_journals_are_created_when_the_server_starts_before_any_slot_can_fill_the_disk(tmp_path):
    ExecutionLog(tmp_path / "executions.jsonl")
    ResultJournal(tmp_path / "results.jsonl")
    assert (tmp_path / "executions.jsonl").exists() and (tmp_path / "results.jsonl").exists()


def test_a_result_the_disk_has_no_room_for_is_kept_in_memory(tmp_path, full_disk, caplog):
    journal = ResultJournal(tmp_path / "results.jsonl")
    output = ToolOutput(call_id="c1", ok=True, output="hi\n")
    journal.put(StoredResult(call_id="c1", slot=0, lease_id="l", output=output))
    assert journal.get("c1") == output
    ExecutionLog(tmp_path / "executions.jsonl").record(
        call_id="c1", slot=0, op="exec", started=0.0, duration=0.1, exit_code=0
    )
    assert "kept in memory only" in caplog.text


def test_a_lease_the_disk_has_no_room_for_is_granted_all_the_same(tmp_path, full_disk, caplog):
    store = LeaseStore(tmp_path / "lease_book.jsonl")
    lease = SlotLease(container_id="c", slot=0, lease_id="l", holder=Holder(workflow_id="w"), expires_at=1.0)
    store.put(persistence.StoredLease(lease=lease, ttl_s=60, allow_network=False))
    store.compact([])
    assert "cannot append" in caplog.text and "cannot compact" in caplog.text
