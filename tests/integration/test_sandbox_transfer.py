"""File transfer and the verifier handle on a real sandbox server process (under bubblewrap when it works here)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from activities.snapshots import SnapshotActivities
from temporal_rollouts.core.errors import BadToolRequest, TransferTooLarge
from temporal_rollouts.core.settings import StorageSettings
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder
from temporal_rollouts.storage.objects import LocalObjectClient
from tests.support.sandbox import ONE_CONTAINER, root_of, runs_of, workspace_of

BIG_BYTES = 50 * 1024 * 1024
RSS_GROWTH_LIMIT = 24 * 1024 * 1024
"""Under half the file: a server that held the payload whole (or as base64 JSON) would grow past it."""


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM line")


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


@pytest.fixture
async def leased(backend):
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        (info,) = await pool.fleet.ensure_running()
        lease = await pool.acquire(Holder(workflow_id="transfer"), ttl_s=120, wait_s=5)
        yield pool, lease, info
        await pool.release(lease)


async def test_a_50mb_file_goes_up_and_back_byte_identical_in_bounded_server_memory(leased, tmp_path):
    pool, lease, info = leased
    source = tmp_path / "big.bin"
    with open(source, "wb") as out:
        for _ in range(BIG_BYTES // (1 << 20)):
            out.write(os.urandom(1 << 20))
    before = peak_rss(info.pid)

    sent = await pool.lease(lease).upload(source, "data/big.bin")
    back = tmp_path / "back" / "big.bin"
    received = await pool.lease(lease).download("/workspace/data/big.bin", back)

    assert sent.bytes == received.bytes == BIG_BYTES
    assert sent.path == "/workspace/data/big.bin"
    assert digest(back) == digest(source)
    workspace = workspace_of(pool.fleet.backend, lease.container_id, lease.slot)
    assert digest(workspace / "data" / "big.bin") == digest(source)
    growth = peak_rss(info.pid) - before
    assert growth < RSS_GROWTH_LIMIT, f"the server's peak RSS grew by {growth / 2**20:.1f} MiB"
    assert not list((workspace.parent / ".transfers").iterdir())


async def test_folders_go_up_and_back_with_binary_files_links_and_empty_folders(leased, tmp_path):
    pool, lease, _ = leased
    tree = tmp_path / "tree"
    (tree / "src" / "pkg").mkdir(parents=True)
    (tree / "empty").mkdir()
    (tree / "src" / "pkg" / "blob.bin").write_bytes(bytes(range(256)) * 10)
    (tree / "README").write_text("hello\n")
    (tree / "link").symlink_to("README")

    slot = pool.lease(lease)
    sent = await slot.upload(tree, "project")
    listing = await slot.list_files("project")
    back = tmp_path / "back"
    received = await slot.download("project", back)

    assert sent.entries == received.entries == 6
    kinds = {entry.path: entry.kind for entry in listing.entries}
    assert kinds == {
        "empty": "dir",
        "src": "dir",
        "src/pkg": "dir",
        "src/pkg/blob.bin": "file",
        "README": "file",
        "link": "link",
    }
    assert (back / "src" / "pkg" / "blob.bin").read_bytes() == bytes(range(256)) * 10
    assert (back / "link").is_symlink() and os.readlink(back / "link") == "README"
    assert (back / "empty").is_dir()
    checked = await slot.execute("check-tree", _exec("cat project/link && wc -c < project/src/pkg/blob.bin"))
    assert checked.output == "hello\n2560\n"


async def test_paths_stay_inside_the_workspace_and_sizes_within_their_limits(leased, tmp_path):
    pool, lease, _ = leased
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * 4096)
    with pytest.raises(BadToolRequest, match="outside the workspace"):
        await pool.lease(lease).upload(small, "../escape.txt")
    with pytest.raises(BadToolRequest, match="outside the workspace"):
        await pool.lease(lease).download("/etc/passwd", tmp_path / "passwd")
    await pool.lease(lease).execute("plant-link", _exec("ln -s /etc planted"))
    with pytest.raises(BadToolRequest, match="file tools do not follow links"):
        await pool.lease(lease).download("planted/hostname", tmp_path / "hostname")
    with pytest.raises(TransferTooLarge):
        await pool.lease(lease, max_transfer_bytes=1000).upload(small, "small.txt")
    large = tmp_path / "large.bin"
    large.write_bytes(b"\0" * (8 << 20))
    with pytest.raises(TransferTooLarge):  # refused as it streams in: the early 413 reaches the client
        await pool.lease(lease, max_transfer_bytes=1 << 20).upload(large, "large.bin")
    assert "large.bin" not in {entry.path for entry in (await pool.lease(lease).list_files()).entries}
    await pool.lease(lease).upload(small, "small.txt")
    with pytest.raises(TransferTooLarge):
        await pool.lease(lease, max_transfer_bytes=1000).download("small.txt", tmp_path / "small-back.txt")
    with pytest.raises(BadToolRequest, match="no such file"):
        await pool.lease(lease).download("missing.txt", tmp_path / "missing.txt")


async def test_a_retried_hook_replays_its_auto_keyed_calls_instead_of_running_them_again(leased, tmp_path):
    pool, lease, info = leased

    async def hook(slot: LeasedSlot) -> list[str]:
        first = await slot.terminal("echo run >> count.txt; wc -l < count.txt")
        await slot.write_file("notes/a.txt", "alpha\n")
        found = await slot.search("alph", "notes")
        read = await slot.read_file("notes/a.txt")
        keyed = await slot.exec("named", "echo named >> count.txt; wc -l < count.txt")
        return [first.output, found.output, read.output, keyed.output]

    attempt = await hook(LeasedSlot(pool, lease, "rollout-1/verify"))
    retried = await hook(LeasedSlot(pool, lease, "rollout-1/verify"))
    assert attempt == retried == ["1\n", "notes/a.txt:1:alpha", "alpha\n", "2\n"]
    slot = LeasedSlot(pool, lease, "rollout-1/verify")
    changed = await slot.terminal("echo other >> count.txt; wc -l < count.txt")  # same position, other command
    assert changed.output == "3\n" and not changed.replayed
    root = root_of(pool.fleet.backend, info.container_id)
    auto_ids = [entry for entry in _call_ids(root) if "/auto-0-exec-" in entry]
    assert len(auto_ids) == 2 and all(runs_of(root, i) == 1 for i in auto_ids)


async def test_the_handle_transfers_and_lists_and_snapshots_stream_through_the_object_store(leased, tmp_path):
    pool, lease, _ = leased
    slot = LeasedSlot(pool, lease, "rollout-2/setup")
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "report.xml").write_text("<ok/>")
    await slot.upload(tmp_path / "in", "reports")
    assert [entry.path for entry in (await slot.list_files("reports")).entries] == ["report.xml"]
    await slot.download("reports/report.xml", tmp_path / "out.xml")
    assert (tmp_path / "out.xml").read_text() == "<ok/>"

    storage = StorageSettings()
    snapshots = SnapshotActivities(pool, LocalObjectClient(tmp_path / "objects"), storage)
    size = await snapshots.save(lease, "snapshots/one.tar.gz")
    assert size == (tmp_path / "objects" / storage.bucket / "snapshots" / "one.tar.gz").stat().st_size
    await slot.terminal("rm -r reports && echo new > other.txt")
    await snapshots.load(lease, "snapshots/one.tar.gz")
    after = await pool.lease(lease).list_files()
    assert [entry.path for entry in after.entries] == ["reports", "reports/report.xml"]


def _exec(command: str):
    from temporal_rollouts.sandbox_server.schema import ExecOp

    return ExecOp(command=command)


def _call_ids(container_root: Path) -> list[str]:
    import json

    path = container_root / "executions.jsonl"
    return [json.loads(line)["call_id"] for line in path.read_text().splitlines() if line.strip()]
