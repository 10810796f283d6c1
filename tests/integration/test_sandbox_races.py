"""An agent that swaps a folder of its workspace with a link to a host folder while the server works on it.

The attack of issue 22: a background process exchanges `inner` (a real folder) and `swap` (a
link to a root-only host folder) with renameat2(RENAME_EXCHANGE) as fast as it can, while the
server reads, writes, downloads, uploads, lists and snapshots `inner/...`. A server that checks
a path and then opens it by name loses that race within a few hundred tries; one that opens
everything from the workspace's descriptor without following links never does. Each test runs
with openat2 and with the component walk that stands in where the kernel lacks it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest

from temporal_rollouts.core.errors import BadToolRequest
from temporal_rollouts.sandbox_server.files import beneath
from temporal_rollouts.sandbox_server.calls import transfer
from temporal_rollouts.sandbox_server.schema import (
    ExecuteRequest,
    Holder,
    ListQuery,
    ReadFileOp,
    TransferQuery,
    WriteFileOp,
)
from temporal_rollouts.sandbox_server.config import ContainerConfig
from temporal_rollouts.sandbox_server.slots.manager import SlotManager

TRIES = 400
HOST_SECRET = "HOST SECRET"
SWAPPER = textwrap.dedent("""
    import ctypes, os, sys
    libc = ctypes.CDLL(None, use_errno=True)
    RENAME_EXCHANGE, AT_FDCWD = 2, -100
    os.chdir(sys.argv[1])
    while True:
        libc.renameat2(AT_FDCWD, b"inner", AT_FDCWD, b"swap", RENAME_EXCHANGE)
""")


@pytest.fixture(params=["openat2", "walk"])
def resolution(request, monkeypatch):
    monkeypatch.setattr(beneath, "USE_OPENAT2", request.param == "openat2")
    if request.param == "openat2" and not beneath._openat2_works():
        pytest.skip("this kernel has no openat2")
    return request.param


@pytest.fixture
def host_folder(tmp_path) -> Path:
    folder = tmp_path / "host-only"
    folder.mkdir(mode=0o700)
    secret = folder / "secret.txt"
    secret.write_text(HOST_SECRET)
    secret.chmod(0o600)
    return folder


@pytest.fixture
async def raced(tmp_path, host_folder, resolution):
    """A leased slot whose `inner` folder a background process keeps swapping with a link to `host_folder`."""
    async with SlotManager(
        ContainerConfig(root=tmp_path / "root", slots_per_container=1, container_id="race")
    ) as manager:
        lease = await manager.acquire(Holder(workflow_id="attacker"), ttl_s=600, wait_s=1)
        slot = manager.leased_slot(lease.slot, lease.lease_id)
        (slot.workspace / "inner").mkdir()
        (slot.workspace / "inner" / "secret.txt").write_text("workspace file")
        (slot.workspace / "swap").symlink_to(host_folder)
        swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(slot.workspace)])
        try:
            yield manager, lease, slot
        finally:
            swapper.kill()
            swapper.wait()


def _request(lease, call_id: str, operation) -> ExecuteRequest:
    return ExecuteRequest(slot=lease.slot, lease_id=lease.lease_id, call_id=call_id, operation=operation)


async def test_read_file_never_returns_a_host_file(raced):
    manager, lease, _ = raced
    answers = []
    for i in range(TRIES):
        try:
            answers.append(
                (await manager.execute(_request(lease, f"r{i}", ReadFileOp(path="inner/secret.txt")))).output
            )
        except BadToolRequest as refused:
            answers.append(str(refused))
    assert not [a for a in answers if HOST_SECRET in a]
    assert "workspace file" in answers  # the race was run, not refused every time


async def test_write_file_never_creates_a_host_file(raced, host_folder):
    manager, lease, _ = raced
    wrote = 0
    for i in range(TRIES):
        try:
            output = await manager.execute(
                _request(lease, f"w{i}", WriteFileOp(path=f"inner/new-{i}.txt", content="x"))
            )
            wrote += output.ok
        except BadToolRequest:
            pass
    assert sorted(p.name for p in host_folder.iterdir()) == ["secret.txt"]
    assert wrote > 0


async def test_downloads_and_listings_never_read_the_host_folder(raced):
    _, lease, slot = raced
    seen = []
    for i in range(TRIES // 4):
        for path, format in (("inner/secret.txt", "file"), ("inner", "tar")):
            try:
                chunks, _, _ = await transfer.send(
                    slot, TransferQuery(slot=0, lease_id=lease.lease_id, path=path, format=format), 1 << 20
                )
                seen.append(b"".join([chunk async for chunk in chunks]))
            except BadToolRequest:
                pass
        try:
            listing = transfer.list_entries(slot, ListQuery(slot=0, lease_id=lease.lease_id, path="inner"))
            seen.append(" ".join(entry.path for entry in listing.entries).encode())
        except BadToolRequest:
            pass
    assert seen and not [data for data in seen if HOST_SECRET.encode() in _unpacked(data)]


async def test_uploads_never_land_in_the_host_folder(raced, host_folder):
    _, lease, slot = raced
    archive = io.BytesIO()
    with tarfile.open(fileobj=archive, mode="w") as tar:
        member = tarfile.TarInfo("planted.txt")
        member.size = 1
        tar.addfile(member, io.BytesIO(b"x"))
    for i in range(TRIES // 4):
        for path, format, body in (("inner/up.txt", "file", b"x"), ("inner", "tar", archive.getvalue())):
            try:
                await transfer.receive(
                    slot, TransferQuery(slot=0, lease_id=lease.lease_id, path=path, format=format), _body(body), 1 << 20
                )
            except BadToolRequest:
                pass
    assert sorted(p.name for p in host_folder.iterdir()) == ["secret.txt"]


async def _body(data: bytes):
    yield data


def _unpacked(data: bytes) -> bytes:
    """The bytes of every file in a tar, or the data itself when it is not one."""
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            return b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]
    except tarfile.TarError:
        return data


def test_a_tool_path_cannot_climb_above_the_workspace():
    assert beneath.ToolPath.parse("/workspace/a/../b/./c").parts == ("b", "c")
    assert beneath.ToolPath.parse("a/b/..").shown == "/workspace/a"
    for path in ("..", "a/../..", "/etc/passwd", "/workspacex/a", "a\0b"):
        with pytest.raises(BadToolRequest):
            beneath.ToolPath.parse(path)


def test_a_walk_never_follows_a_link_and_refuses_to_go_too_deep(tmp_path, resolution):
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "a" / "b" / "f").write_text("x")
    (tmp_path / "a" / "out").symlink_to("/etc")
    root = beneath.open_root(tmp_path)
    try:
        assert [path for path, *_ in beneath.walk(root)] == ["a", "a/b", "a/b/f", "a/out"]
        with pytest.raises(BadToolRequest, match="deeper than 2"):
            list(beneath.walk(root, max_depth=2))
        for parts in (("a", "out", "passwd"), ("a", "out")):
            with pytest.raises(OSError) as refused:
                os.close(beneath.open_beneath(root, parts, os.O_RDONLY))
            assert beneath.refused(refused.value)
    finally:
        os.close(root)


def test_an_unexpected_server_error_never_names_a_host_path():
    from temporal_rollouts.sandbox_server.http.app import _without_host_paths

    message = _without_host_paths(FileNotFoundError(2, "No such file or directory", "/srv/rollouts/slot-3/workspace/x"))
    assert message == "FileNotFoundError: No such file or directory" and "/srv" not in message
    assert _without_host_paths(ValueError("/srv/rollouts/slot-3 is bad")) == "ValueError"
