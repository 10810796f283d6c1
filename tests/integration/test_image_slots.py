"""Slots on an item image, on real sandbox servers: every guarantee of a slot holds, and the image cannot
be turned against the host.

One image carries the attacks a Dockerfile can make: a setuid binary owned by another user, device nodes
of the host's disk and memory, links that point out (to a host path, to `/`), and `/workspace` and `/logs`
that are links. Each test checks what the agent can do with them, from inside (commands) and through the
server (file tools, snapshots), and what the host sees afterwards.
"""

from __future__ import annotations

import asyncio
import io
import secrets
import socket
import subprocess
import sys
import tarfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from temporal_rollouts.core.errors import BadToolRequest
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.calls import transfer
from temporal_rollouts.sandbox_server.config import ContainerConfig
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.schema import (
    ExecOp,
    ExecuteRequest,
    Holder,
    ReadFileOp,
    SessionOp,
    TransferQuery,
    WriteFileOp,
)
from temporal_rollouts.sandbox_server.slots.manager import SlotManager
from tests.support.images import builder_on, image_slot_pool, needs_image_tools, unmount_under, write_context
from tests.support.sandbox import needs_bubblewrap

# slow: the module builds its images first
pytestmark = [pytest.mark.slow, needs_image_tools, needs_bubblewrap, pytest.mark.timeout(900)]

HOST_PROBE = Path("/run/rollouts-test-host-probe")
"""A host file an image's link names: a slot must never read it."""
ATTACKS = f"""\
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 421 ledger \\
    && cp /usr/bin/id /usr/local/bin/id-as-ledger && chown ledger /usr/local/bin/id-as-ledger \\
    && chmod 4755 /usr/local/bin/id-as-ledger \\
    && mknod /host-disk b 254 0 && mknod /host-memory c 1 1 \\
    && ln -s {HOST_PROBE} /probe && ln -s / /hostroot \\
    && mkdir -p /data/folder && echo image-file > /data/kept && echo a > /data/folder/a \\
    && rm -rf /logs && ln -s /etc /logs
WORKDIR /workspace
RUN rm -rf /workspace && ln -s /srv /workspace
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("image-slots") / "store"
    yield folder
    unmount_under(folder)


@pytest.fixture(scope="module")
async def attack_image(store: Path, tmp_path_factory) -> BuiltImage:
    context = write_context(tmp_path_factory.mktemp("attacks") / "attacks", ATTACKS)
    return await builder_on(store).ready(ImageSpec(context=str(context), name="attacks"))


@pytest.fixture
async def pool(store: Path, tmp_path: Path) -> AsyncIterator[SandboxPool]:
    async with image_slot_pool(store, tmp_path / "data") as made:
        yield made


async def run(pool: SandboxPool, lease, command: str, resident: bool = False) -> str:
    operation = ExecOp(command=command, timeout_s=60, resident=resident)
    return (await pool.lease(lease).execute(f"c-{secrets.token_hex(4)}", operation)).output


async def test_each_slot_is_root_of_its_own_namespace_and_a_distinct_host_uid_with_no_network(pool, attack_image):
    a = await pool.acquire(Holder(workflow_id="a"), wait_s=60, image=attack_image)
    b = await pool.acquire(Holder(workflow_id="b"), wait_s=60, image=attack_image)
    maps = [await run(pool, lease, "id -u; cat /proc/self/uid_map") for lease in (a, b)]
    uids = []
    for answer in maps:
        first, mapping = answer.splitlines()[0], answer.splitlines()[1].split()
        assert first == "0" and mapping[0] == "0" and mapping[2] == "1", answer
        uids.append(int(mapping[1]))
    assert len(set(uids)) == 2 and min(uids) >= 1000, "two slots, two unprivileged host uids"
    terminal = pool.lease(a)
    started = await terminal.execute("session-start", SessionOp(action="run", text="cd /data && id -u"))
    again = await terminal.execute("session-again", SessionOp(action="run", text="pwd; cat kept"))
    assert "0" in started.output and again.output.split() == ["/data", "image-file"], (started, again)
    health = await pool.fleet.send(a.container_id, HealthQuery())
    assert health.image == attack_image.name
    with socket.create_server(("0.0.0.0", 0)) as listener:
        port = listener.getsockname()[1]
        probe = f"(exec 3<>/dev/tcp/127.0.0.1/{port}) 2>/dev/null && echo REACHED || echo BLOCKED; cat /proc/net/dev"
        answer = await run(pool, a, probe)
    assert "BLOCKED" in answer and "eth" not in answer, answer


async def test_an_images_setuid_binary_device_nodes_and_links_out_do_nothing(pool, attack_image):
    HOST_PROBE.write_text("host-only-probe\n")
    try:
        lease = await pool.acquire(Holder(workflow_id="setuid"), wait_s=60, image=attack_image)
        answer = await run(
            pool,
            lease,
            "/usr/local/bin/id-as-ledger -u; head -c 1 /host-disk; head -c 1 /host-memory; cat /probe; ls /hostroot/run",
        )
        lines = answer.splitlines()
        assert lines[0] == "0", f"the setuid bit of another user's binary changes nothing: {answer}"
        assert "host-only-probe" not in answer and "rollouts-test-host-probe" not in answer
        assert answer.count("Permission denied") + answer.count("Operation not permitted") >= 2, answer
        with pytest.raises(BadToolRequest, match="link"):
            await pool.lease(lease).execute("read-probe", ReadFileOp(path="/probe"))
        # the agent's own commands cannot set a setuid bit; a hook's may, and the walk after it strips it
        agent = await run(pool, lease, "cp /bin/sh /usr/local/bin/sh4 && chmod 4755 /usr/local/bin/sh4", resident=True)
        assert "Operation not permitted" in agent, agent
        await run(pool, lease, "cp /bin/sh /usr/local/bin/sh5 && chmod 4755 /usr/local/bin/sh5")
        assert await run(pool, lease, "stat -c %a /usr/local/bin/sh4 /usr/local/bin/sh5") == "755\n755\n"
    finally:
        HOST_PROBE.unlink(missing_ok=True)


async def test_an_image_whose_workspace_and_logs_are_links_keeps_the_server_in_the_slot(pool, attack_image, tmp_path):
    lease = await pool.acquire(Holder(workflow_id="links"), wait_s=60, image=attack_image)
    slot = pool.lease(lease)
    assert (await run(pool, lease, "pwd -P; echo planted > /logs/planted-by-agent; ls /etc/planted-by-agent")) == (
        "/srv\n/etc/planted-by-agent\n"
    ), "commands follow the links inside the slot's own root"
    for path in ("/logs/planted-by-agent", "/workspace/x", "notes.txt"):
        with pytest.raises(BadToolRequest, match="link"):
            await slot.execute(f"read-{path}", ReadFileOp(path=path))
        with pytest.raises(BadToolRequest, match="link"):
            await slot.execute(f"write-{path}", WriteFileOp(path=path, content="x"))
    assert not Path("/etc/planted-by-agent").exists()
    archive = tmp_path / "snapshot.tar.gz"
    await slot.archive_to(archive)
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert "etc/planted-by-agent" in names and not any(name.startswith("proc") for name in names)


async def test_an_agent_that_fills_its_layer_fills_its_own_volume(pool, attack_image):
    a = await pool.acquire(Holder(workflow_id="filler"), wait_s=60, image=attack_image)
    b = await pool.acquire(Holder(workflow_id="neighbour"), wait_s=60, image=attack_image)
    filled = await pool.lease(a).execute(
        "fill", ExecOp(command="dd if=/dev/zero of=/usr/fill bs=1M count=200", timeout_s=120)
    )
    assert not filled.ok and ("No space left" in filled.output or "past" in filled.output), filled.output
    # what was written is bounded by the slot's 64 MB volume, not the host's disk (which other tests share
    # while this runs, so its free space is no measure)
    written = await run(pool, a, "stat -c %s /usr/fill 2>/dev/null || echo 0")
    assert int(written.split()[0]) < 100 * 1024 * 1024, f"the layer held {written} bytes"
    assert (await run(pool, b, "echo neighbour-fine > /etc/fine && cat /etc/fine")) == "neighbour-fine\n"


async def test_a_snapshot_and_a_copy_carry_the_layer_deletions_included(pool, attack_image, tmp_path):
    source = await pool.acquire(Holder(workflow_id="source"), wait_s=60, image=attack_image)
    await run(
        pool,
        source,
        "echo new > /etc/added && rm /data/kept && rm -rf /data/folder && mkdir /data/folder && echo b > /data/folder/b",
    )
    expected = await run(pool, source, "cat /etc/added; ls /data; ls /data/folder")
    assert expected == "new\nfolder\nb\n"
    snapshot = tmp_path / "layer.tar.gz"
    await pool.lease(source).archive_to(snapshot)
    copy = await pool.acquire(Holder(workflow_id="copy"), wait_s=60, image=attack_image)
    await pool.lease(copy).copy_from(source)
    assert await run(pool, copy, "cat /etc/added; ls /data; ls /data/folder") == expected
    await pool.release(copy)
    await pool.release(source)
    fresh = await pool.acquire(Holder(workflow_id="restored"), wait_s=60, image=attack_image)
    assert await run(pool, fresh, "cat /etc/added 2>&1; ls /data") != expected, "a released slot is reset"
    await pool.lease(fresh).restore_from(snapshot)
    assert await run(pool, fresh, "cat /etc/added; ls /data; ls /data/folder; id -u") == expected + "0\n"


# --- the descriptor-based file access, raced, on an image's root --------------------------------------------

SWAPPER = """
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
os.chdir(sys.argv[1])
while True:
    libc.renameat2(-100, b"inner", -100, b"swap", 2)
"""


@pytest.fixture
async def raced_image(store: Path, attack_image: BuiltImage, tmp_path: Path):
    """A slot on the image whose `/inner` folder a process keeps swapping with a link to a host folder."""
    host = tmp_path / "host-only"
    host.mkdir(mode=0o700)
    (host / "secret.txt").write_text("HOST SECRET")
    config = ContainerConfig(
        root=tmp_path / "root",
        slots_per_container=1,
        container_id="race-image",
        image_layers=await builder_on(store).store.layers(attack_image.name),
        image_env=list(attack_image.config.env),
        image_name=attack_image.name,
    )
    async with SlotManager(config) as manager:
        lease = await manager.acquire(Holder(workflow_id="attacker"), ttl_s=600, wait_s=1)
        slot = manager.leased_slot(lease.slot, lease.lease_id)
        (slot.workspace / "inner").mkdir()
        (slot.workspace / "inner" / "secret.txt").write_text("slot file")
        (slot.workspace / "swap").symlink_to(host)
        swapper = subprocess.Popen([sys.executable, "-c", SWAPPER, str(slot.workspace)])
        try:
            yield manager, lease, slot, host
        finally:
            swapper.kill()
            swapper.wait()


async def test_file_tools_on_an_images_root_never_reach_a_host_folder_swapped_in(raced_image):
    manager, lease, slot, host = raced_image
    answers, wrote = [], 0
    for i in range(300):
        request = ExecuteRequest(
            slot=lease.slot, lease_id=lease.lease_id, call_id=f"r{i}", operation=ReadFileOp(path="/inner/secret.txt")
        )
        try:
            answers.append((await manager.execute(request)).output)
        except BadToolRequest as refused:
            answers.append(str(refused))
        write = WriteFileOp(path=f"/inner/new-{i}.txt", content="x")
        try:
            wrote += (await manager.execute(request.model_copy(update={"call_id": f"w{i}", "operation": write}))).ok
        except BadToolRequest:
            pass
        if i % 30 == 0:
            try:
                chunks, _, _ = await transfer.send(
                    slot, TransferQuery(slot=0, lease_id=lease.lease_id, path="/inner", format="tar"), 1 << 20
                )
                answers.append(b"".join([chunk async for chunk in chunks]).decode(errors="replace"))
            except BadToolRequest:
                pass
    assert not [answer for answer in answers if "HOST SECRET" in answer]
    assert "slot file" in answers and wrote > 0, "the race was run, not refused every time"
    assert sorted(path.name for path in host.iterdir()) == ["secret.txt"]


def _unpacked(data: bytes) -> bytes:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return b"".join(tar.extractfile(m).read() for m in tar.getmembers() if m.isfile())  # type: ignore[union-attr]


async def test_a_slot_manager_on_an_image_refuses_to_start_without_its_layers(tmp_path):
    config = ContainerConfig(
        root=tmp_path / "root",
        slots_per_container=1,
        container_id="no-layers",
        image_layers=[tmp_path / "missing-layer"],
        image_name="gone",
    )
    with pytest.raises(Exception, match="layer folders are missing"):
        async with SlotManager(config):
            pass
    await asyncio.sleep(0)
