"""SlotManager in-process: file operations, path escapes, replays, resets and isolation modes."""

from __future__ import annotations

import asyncio
import time

import pytest

from temporal_rollouts.core.errors import BadToolRequest, LeaseLost, SandboxRequired
from temporal_rollouts.sandbox_server.isolation import bubblewrap
from temporal_rollouts.sandbox_server.slots import slotbook
from temporal_rollouts.sandbox_server.state.persistence import (
    LEASE_FILE,
    LeaseStore,
    ResultJournal,
    StoredResult,
)
from temporal_rollouts.sandbox_server.schema import (
    ExecOp,
    ExecuteRequest,
    Holder,
    Operation,
    ReadFileOp,
    SearchOp,
    SlotLease,
    ToolOutput,
    WriteFileOp,
)
from temporal_rollouts.sandbox_server.config import ContainerConfig
from temporal_rollouts.sandbox_server.slots.manager import SlotManager
from tests.support.sandbox import needs_bubblewrap, processes_running, runs_of, unique_sleep


@pytest.fixture
async def manager(tmp_path):
    async with SlotManager(
        ContainerConfig(
            root=tmp_path / "root", slots_per_container=2, container_id="test-container", max_output_chars=5_000
        )
    ) as slots:
        yield slots


@pytest.fixture
async def lease(manager) -> SlotLease:
    return await manager.acquire(Holder(workflow_id="wf"), ttl_s=60, wait_s=1)


def call(lease: SlotLease, call_id: str, operation: Operation) -> ExecuteRequest:
    return ExecuteRequest(slot=lease.slot, lease_id=lease.lease_id, call_id=call_id, operation=operation)


async def test_write_read_and_search_round_trip(manager, lease):
    wrote = await manager.execute(
        call(lease, "w", WriteFileOp(path="/workspace/src/app.py", content="x = 1\ny = 22\n"))
    )
    read = await manager.execute(call(lease, "r", ReadFileOp(path="src/app.py")))
    found = await manager.execute(call(lease, "s", SearchOp(pattern=r"\d{2}")))
    nothing = await manager.execute(call(lease, "n", SearchOp(pattern="absent", path="src")))
    listed = await manager.execute(call(lease, "l", ExecOp(command="cat src/app.py")))
    assert wrote.ok and "/workspace/src/app.py" in wrote.output
    assert read.ok and read.output == "x = 1\ny = 22\n"
    assert found.ok and found.output == "src/app.py:2:y = 22"
    assert nothing.ok and nothing.output == "no matches"
    assert listed.output == "x = 1\ny = 22\n"


async def test_search_caps_matches(manager, lease):
    await manager.execute(call(lease, "w", WriteFileOp(path="many.txt", content="hit\n" * 50)))
    found = await manager.execute(call(lease, "s", SearchOp(pattern="hit", max_matches=5)))
    lines = found.output.splitlines()
    assert found.truncated and len(lines) == 6
    assert lines[:5] == [f"many.txt:{n}:hit" for n in range(1, 6)]


async def test_missing_files_and_directories_are_tool_errors(manager, lease):
    missing = await manager.execute(call(lease, "m", ReadFileOp(path="nope.txt")))
    await manager.execute(call(lease, "d", ExecOp(command="mkdir adir")))
    directory = await manager.execute(call(lease, "r", ReadFileOp(path="adir")))
    onto_dir = await manager.execute(call(lease, "w", WriteFileOp(path="adir", content="x")))
    assert not missing.ok and missing.output == "file not found: /workspace/nope.txt"
    assert not directory.ok and "is a directory" in directory.output
    assert not onto_dir.ok and "adir" in onto_dir.output


@pytest.mark.parametrize("path", ["../escape.txt", "/etc/passwd", "/workspace/../../escape.txt", "/tmp/x", "a/../../b"])
async def test_paths_outside_the_workspace_are_refused(manager, lease, path, tmp_path):
    with pytest.raises(BadToolRequest):
        await manager.execute(call(lease, f"r{path}", ReadFileOp(path=path)))
    with pytest.raises(BadToolRequest):
        await manager.execute(call(lease, f"w{path}", WriteFileOp(path=path, content="owned")))
    with pytest.raises(BadToolRequest):
        await manager.execute(call(lease, f"s{path}", SearchOp(pattern="root", path=path)))
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "root" / "escape.txt").exists()
    assert runs_of(manager.config.root, f"r{path}") == 0


async def test_symlinks_planted_in_the_workspace_cannot_reach_out(manager, lease, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("host secret")
    workspace = manager.leased_slot(lease.slot, lease.lease_id).workspace
    (workspace / "dir_link").symlink_to(outside)
    (workspace / "file_link").symlink_to(outside / "secret.txt")
    for path in ["dir_link/secret.txt", "file_link", "/workspace/file_link"]:
        with pytest.raises(BadToolRequest):
            await manager.execute(call(lease, f"r-{path}", ReadFileOp(path=path)))
    with pytest.raises(BadToolRequest):
        await manager.execute(call(lease, "w", WriteFileOp(path="dir_link/new.txt", content="x")))
    assert (outside / "secret.txt").read_text() == "host secret"
    assert not (outside / "new.txt").exists()


async def test_file_tools_refuse_even_inner_symlinks_which_commands_still_follow(manager, lease):
    """The server's file tools never pass through a link (a link checked now may point elsewhere when
    opened); the slot's commands resolve links in their own sandboxed view, as before."""
    await manager.execute(call(lease, "e", ExecOp(command="mkdir real && echo inside > real/f && ln -s real alias")))
    with pytest.raises(BadToolRequest, match="symbolic link"):
        await manager.execute(call(lease, "r", ReadFileOp(path="alias/f")))
    shown = await manager.execute(call(lease, "cat", ExecOp(command="cat alias/f")))
    assert shown.ok and shown.output == "inside\n"


async def test_concurrent_repeats_of_a_call_id_run_once(manager, lease):
    request = call(lease, "dup", ExecOp(command="sleep 0.3; echo run >> count.txt; wc -l < count.txt"))
    first, second = await asyncio.gather(manager.execute(request), manager.execute(request))
    third = await manager.execute(request)
    assert sorted([first.replayed, second.replayed]) == [False, True] and third.replayed
    assert first.output == second.output == third.output == "1\n"
    assert runs_of(manager.config.root, "dup") == 1


async def test_stored_results_survive_a_new_manager_on_the_same_root(tmp_path):
    root = tmp_path / "root"
    async with SlotManager(ContainerConfig(root=root, slots_per_container=1, container_id="c")) as first:
        lease = await first.acquire(Holder(workflow_id="wf"), ttl_s=60, wait_s=1)
        original = await first.execute(call(lease, "once", ExecOp(command="echo x >> f; wc -l < f")))
    async with SlotManager(ContainerConfig(root=root, slots_per_container=1, container_id="c")) as second:
        replay = await second.execute(call(lease, "once", ExecOp(command="echo x >> f; wc -l < f")))
        files = await second.execute(call(lease, "cat", ReadFileOp(path="f")))
    assert replay.replayed and replay.output == original.output == "1\n"
    assert files.output == "x\n"
    assert runs_of(root, "once") == 1


async def test_journal_keeps_only_the_most_recent_results(tmp_path):
    async with SlotManager(
        ContainerConfig(root=tmp_path / "root", slots_per_container=1, container_id="c", results_kept=3)
    ) as slots:
        lease = await slots.acquire(Holder(workflow_id="wf"), ttl_s=60, wait_s=1)
        for n in range(5):
            await slots.execute(call(lease, f"c{n}", WriteFileOp(path=f"f{n}", content="x")))
        oldest = await slots.execute(call(lease, "c0", WriteFileOp(path="f0", content="x")))
        newest = await slots.execute(call(lease, "c4", WriteFileOp(path="f4", content="x")))
    assert not oldest.replayed and newest.replayed


async def test_release_kills_running_commands_and_empties_the_workspace(manager, lease):
    marker = unique_sleep()
    await manager.execute(call(lease, "w", WriteFileOp(path=".hidden/deep/file", content="x")))
    running = asyncio.create_task(manager.execute(call(lease, "long", ExecOp(command=f"sleep {marker}; touch late"))))
    await asyncio.sleep(0.3)
    started = time.monotonic()
    assert (await manager.release(lease.slot, lease.lease_id)).released
    with pytest.raises(LeaseLost):
        await running
    assert time.monotonic() - started < 2
    assert list((manager.config.root / f"slot-{lease.slot}" / "volume" / "workspace").iterdir()) == []
    assert processes_running(marker) == []


async def test_operations_need_the_current_lease(manager, lease):
    with pytest.raises(LeaseLost):
        await manager.execute(
            ExecuteRequest(slot=lease.slot, lease_id="forged", call_id="x", operation=ExecOp(command="true"))
        )
    with pytest.raises(BadToolRequest):
        await manager.execute(
            ExecuteRequest(slot=99, lease_id=lease.lease_id, call_id="y", operation=ExecOp(command="true"))
        )
    assert (await manager.release(lease.slot, "forged")).released is False


async def test_a_holder_asking_again_gets_its_own_lease_back(manager, lease):
    again = await manager.acquire(Holder(workflow_id="wf"), ttl_s=60, wait_s=0)
    other = await manager.acquire(Holder(workflow_id="other"), ttl_s=60, wait_s=0)
    assert again.lease_id == lease.lease_id and again.slot == lease.slot
    assert other.slot != lease.slot


@needs_bubblewrap
async def test_health_reports_bubblewrap(manager):
    health = manager.health()
    assert health.isolation == "bubblewrap" and health.slots == 2 and health.free == 2


async def test_without_bubblewrap_the_manager_reports_it_and_can_refuse(tmp_path, monkeypatch):
    monkeypatch.setattr(bubblewrap, "bubblewrap_path", lambda: None)
    async with SlotManager(
        ContainerConfig(root=tmp_path / "strict", slots_per_container=1, container_id="c", require_isolation=True)
    ) as strict:
        lease = await strict.acquire(Holder(workflow_id="wf"), ttl_s=60, wait_s=1)
        with pytest.raises(SandboxRequired):
            await strict.execute(call(lease, "e", ExecOp(command="touch ran")))
        wrote = await strict.execute(call(lease, "w", WriteFileOp(path="f", content="x")))
        assert strict.health().isolation == "none"
        assert not (strict.leased_slot(0, lease.lease_id).workspace / "ran").exists()
    assert wrote.ok
    assert runs_of(tmp_path / "strict", "e") == 0


async def test_a_cancelled_waiter_leaves_the_line_without_taking_a_slot(tmp_path):
    async with SlotManager(ContainerConfig(root=tmp_path / "root", slots_per_container=1, container_id="c")) as slots:
        holder_lease = await slots.acquire(Holder(workflow_id="first"), ttl_s=60, wait_s=0)
        gone = asyncio.create_task(slots.acquire(Holder(workflow_id="gone"), ttl_s=60, wait_s=10))
        await asyncio.sleep(0.05)
        assert slots.health().waiters == 1
        gone.cancel()
        await asyncio.sleep(0.05)
        assert slots.health().waiters == 0
        await slots.release(holder_lease.slot, holder_lease.lease_id)
        assert slots.health().free == 1
        assert [state.lease for state in slots.slot_states()] == [None]


async def test_operations_keep_a_lease_alive(tmp_path):
    async with SlotManager(
        ContainerConfig(root=tmp_path / "root", slots_per_container=1, container_id="c", sweep_interval_s=0.1)
    ) as slots:
        lease = await slots.acquire(Holder(workflow_id="busy"), ttl_s=0.5, wait_s=0)
        for n in range(6):
            await asyncio.sleep(0.2)
            await slots.execute(call(lease, f"keepalive-{n}", ExecOp(command="true")))
        renewed = slots.renew(lease.slot, lease.lease_id, ttl_s=0.3)
        await asyncio.sleep(0.6)
        with pytest.raises(LeaseLost):
            await slots.execute(call(lease, "too-late", ExecOp(command="true")))
    assert renewed.expires_at > lease.expires_at


def test_result_journal_is_bounded_by_output_size_and_reloads(tmp_path):
    journal = ResultJournal(tmp_path / "results.jsonl", limit=100, max_chars=100)
    for n in range(5):
        output = ToolOutput(call_id=f"c{n}", ok=True, output=str(n) * 40)
        journal.put(StoredResult(call_id=f"c{n}", slot=0, lease_id="l", output=output))
    reloaded = ResultJournal(tmp_path / "results.jsonl", limit=100, max_chars=100)
    assert len(journal) == len(reloaded) == 2
    assert journal.get("c0") is None and reloaded.get("c4").output == "4" * 40
    assert len((tmp_path / "results.jsonl").read_text().splitlines()) == 2


def test_results_stored_after_a_compaction_reach_the_new_file(tmp_path):
    """The journal keeps its file open for appending; a compaction replaces the file, and what is
    stored after it must land in the new one (not the replaced inode) for a restart to find it."""
    path = tmp_path / "results.jsonl"
    journal = ResultJournal(path, limit=2)
    for n in range(12):  # compacts whenever the file passes twice the limit
        journal.put(
            StoredResult(call_id=f"c{n}", slot=0, lease_id="l", output=ToolOutput(call_id=f"c{n}", ok=True, output=""))
        )
    reloaded = ResultJournal(path, limit=2)
    assert reloaded.get("c11") is not None and reloaded.get("c10") is not None and reloaded.get("c9") is None
    journal.close()
    journal.put(StoredResult(call_id="c12", slot=0, lease_id="l", output=ToolOutput(call_id="c12", ok=True, output="")))
    assert ResultJournal(path, limit=2).get("c12") is not None  # a closed journal opens its file again


async def test_renewals_write_the_lease_journal_rarely_and_a_restart_keeps_the_lease(tmp_path, monkeypatch):
    """The journal holds an expiry a quarter TTL ahead of the real one; renewals within that
    margin write nothing, and a restart right after any renewal still finds the lease alive."""
    writes: list[str] = []
    real_put = LeaseStore.put

    def counted_put(self, stored):
        writes.append(stored.lease.lease_id)
        real_put(self, stored)

    monkeypatch.setattr(LeaseStore, "put", counted_put)
    root = tmp_path / "root"
    async with SlotManager(
        ContainerConfig(root=root, slots_per_container=2, container_id="c", sweep_interval_s=0.05)
    ) as first:
        lease = await first.acquire(Holder(workflow_id="wf"), ttl_s=2.0, wait_s=0)
        for n in range(20):
            await first.execute(call(lease, f"renewing-{n}", ExecOp(command="true")))
            first.renew(lease.slot, lease.lease_id, ttl_s=2.0)
        real_expiry = first.slot_states()[lease.slot].lease.expires_at
        stored = LeaseStore(root / LEASE_FILE).load()
        assert len(writes) < 10, f"{len(writes)} lease journal writes for 40 renewals"
        assert [s.lease.lease_id for s in stored] == [lease.lease_id]
        assert real_expiry <= stored[0].lease.expires_at <= real_expiry + 0.25 * 2.0 + 0.01
    async with SlotManager(
        ContainerConfig(root=root, slots_per_container=2, container_id="c", sweep_interval_s=0.05)
    ) as restarted:
        again = await restarted.execute(call(lease, "after-restart", ExecOp(command="echo alive")))
        await restarted.release(lease.slot, lease.lease_id)
        assert LeaseStore(root / LEASE_FILE).load() == []
    assert again.output == "alive\n"


async def test_the_lease_journal_survives_many_grants_and_a_torn_line(tmp_path, monkeypatch):
    monkeypatch.setattr(slotbook, "COMPACT_LINES", 8)
    root = tmp_path / "root"
    async with SlotManager(ContainerConfig(root=root, slots_per_container=2, container_id="c")) as first:
        for n in range(10):  # grants and releases past the compaction threshold
            passing = await first.acquire(Holder(workflow_id=f"passing-{n}"), ttl_s=60, wait_s=0)
            await first.release(passing.slot, passing.lease_id)
        kept = await first.acquire(Holder(workflow_id="kept"), ttl_s=60, wait_s=1)
    journal = root / LEASE_FILE
    assert len(journal.read_text().splitlines()) < 8
    with journal.open("a") as file:
        file.write('{"drop": "half-writ')  # a crash in the middle of a write
    async with SlotManager(ContainerConfig(root=root, slots_per_container=2, container_id="c")) as restarted:
        assert [s.lease.lease_id for s in restarted.slot_states() if s.lease] == [kept.lease_id]


async def test_a_lease_that_lapsed_before_a_restart_is_not_restored(tmp_path):
    root = tmp_path / "root"
    async with SlotManager(ContainerConfig(root=root, slots_per_container=1, container_id="c")) as first:
        lease = await first.acquire(Holder(workflow_id="wf"), ttl_s=0.2, wait_s=0)
    await asyncio.sleep(0.4)  # past the real expiry and the saved one (a quarter TTL later)
    async with SlotManager(ContainerConfig(root=root, slots_per_container=1, container_id="c")) as restarted:
        assert [state.lease for state in restarted.slot_states()] == [None]
        with pytest.raises(LeaseLost):
            await restarted.execute(call(lease, "too-late", ExecOp(command="true")))
