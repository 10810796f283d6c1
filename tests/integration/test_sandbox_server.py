"""The sandbox server as a real process started by LocalBackend, driven through SandboxClient."""

from __future__ import annotations

import asyncio
import time
import uuid

import httpx
import pytest

from temporal_rollouts.core.errors import BadToolRequest, LeaseLost, SandboxAuthError, SlotUnavailable
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.requests import HealthQuery, SlotsQuery
from temporal_rollouts.sandbox_server.config import ServerOptions
from temporal_rollouts.sandbox_server.schema import AcquireRequest, ExecOp, Holder, ReadFileOp, SlotLease, WriteFileOp
from tests.support.sandbox import sandbox_settings
from tests.support.sandbox import (
    execute_in,
    host_listener,
    needs_bubblewrap,
    processes_running,
    release_of,
    root_of,
    running_container,
    runs_of,
    unique_sleep,
    workspace_of,
)

OUTPUT_CAP = 2_000


@pytest.fixture(scope="module")
async def backend(tmp_path_factory) -> LocalBackend:
    # Network-on slots reach the host network (control plane included), so a server refuses them unless
    # told otherwise; this container says so, for the test of what network on and off mean.
    return LocalBackend(
        tmp_path_factory.mktemp("data"),
        sandbox_settings(
            ServerOptions(max_output_chars=OUTPUT_CAP, allow_network_unprotected=True),
            slots_per_container=3,
            sweep_interval_s=0.3,
        ),
    )


@pytest.fixture(scope="module")
async def multi(backend):
    async with running_container(backend) as started:
        yield started


@pytest.fixture(scope="module")
async def single(tmp_path_factory):
    backend = LocalBackend(
        tmp_path_factory.mktemp("single"), sandbox_settings(slots_per_container=1, sweep_interval_s=0.3)
    )
    async with running_container(backend) as (info, client):
        yield backend, info, client


@pytest.fixture
async def leases(multi):
    """Leases taken on the multi-slot container, released after the test."""
    _, client = multi
    taken: list[SlotLease] = []

    async def take(allow_network: bool = False) -> SlotLease:
        who = Holder(workflow_id=uuid.uuid4().hex)
        lease = await client.send(AcquireRequest(holder=who, ttl_s=60, wait_s=5, allow_network=allow_network))
        taken.append(lease)
        return lease

    yield take
    for lease in taken:
        await client.send(release_of(lease))


def holder(name: str) -> Holder:
    return Holder(workflow_id=f"{name}-{uuid.uuid4().hex[:6]}")


async def test_health_is_public_and_everything_else_needs_the_token(multi):
    info, _ = multi
    async with SandboxClient(info.url, "wrong-token") as wrong:
        health = await wrong.send(HealthQuery())
        with pytest.raises(SandboxAuthError):
            await wrong.send(SlotsQuery())
        with pytest.raises(SandboxAuthError):
            await wrong.send(AcquireRequest(holder=holder("intruder"), wait_s=0))
    async with httpx.AsyncClient(base_url=info.url) as raw:
        missing = await raw.post("/execute", json={})
        rebound = await raw.get("/health", headers={"Host": "attacker.example"})
    assert health.container_id == info.container_id and health.slots == 3
    assert rebound.status_code == 421 and info.container_id not in rebound.text
    assert missing.status_code == 401
    assert missing.json()["error"]["type"] == "SandboxAuthError"


async def test_invalid_requests_come_back_as_clear_400s(multi):
    info, _ = multi
    headers = {"Authorization": f"Bearer {info.read_token()}"}
    async with httpx.AsyncClient(base_url=info.url, headers=headers) as raw:
        bad_op = await raw.post(
            "/execute", json={"slot": 0, "lease_id": "x", "call_id": "c", "operation": {"op": "rm"}}
        )
        not_json = await raw.post("/slots/acquire", content=b"{not json")
    assert bad_op.status_code == 400 and not_json.status_code == 400
    assert bad_op.json()["error"]["type"] == "BadToolRequest"
    assert "operation" in bad_op.json()["error"]["message"]
    assert not_json.json()["error"]["type"] == "BadToolRequest"


async def test_waiters_are_served_first_come_first_served(single):
    _, _, client = single
    first = await client.send(AcquireRequest(holder=holder("first"), ttl_s=60, wait_s=1))
    second_task = asyncio.create_task(client.send(AcquireRequest(holder=holder("second"), ttl_s=60, wait_s=10)))
    await asyncio.sleep(0.2)
    third_task = asyncio.create_task(client.send(AcquireRequest(holder=holder("third"), ttl_s=60, wait_s=10)))
    await asyncio.sleep(0.2)
    assert (await client.send(HealthQuery())).waiters == 2
    released_at = time.monotonic()
    await client.send(release_of(first))
    second = await second_task
    assert time.monotonic() - released_at < 1.0
    assert second.holder.workflow_id.startswith("second") and not third_task.done()
    await client.send(release_of(second))
    third = await third_task
    assert third.holder.workflow_id.startswith("third")
    await client.send(release_of(third))


async def test_acquire_gives_up_after_its_wait(single):
    _, _, client = single
    lease = await client.send(AcquireRequest(holder=holder("holder"), ttl_s=60, wait_s=1))
    started = time.monotonic()
    with pytest.raises(SlotUnavailable):
        await client.send(AcquireRequest(holder=holder("impatient"), ttl_s=60, wait_s=0.4))
    waited = time.monotonic() - started
    assert 0.4 <= waited < 2.0
    assert (await client.send(HealthQuery())).waiters == 0
    await client.send(release_of(lease))


async def test_an_expired_lease_frees_the_slot_for_a_waiter(single):
    backend, info, client = single
    stale = await client.send(AcquireRequest(holder=holder("forgetful"), ttl_s=0.5, wait_s=1))
    await client.send(execute_in(stale, "leftover", WriteFileOp(path="leftover.txt", content="x")))
    started = time.monotonic()
    fresh = await client.send(AcquireRequest(holder=holder("patient"), ttl_s=60, wait_s=5))
    assert time.monotonic() - started < 2.0
    assert fresh.lease_id != stale.lease_id
    with pytest.raises(LeaseLost):
        await client.send(execute_in(stale, "late", ExecOp(command="true")))
    assert (await client.send(release_of(stale))).released is False
    assert not (workspace_of(backend, info.container_id, fresh.slot) / "leftover.txt").exists()
    await client.send(release_of(fresh))


async def test_release_resets_the_workspace(single):
    _, _, client = single
    lease = await client.send(AcquireRequest(holder=holder("messy"), ttl_s=60, wait_s=1))
    made = await client.send(execute_in(lease, "mk", ExecOp(command="mkdir -p d/e && touch d/e/f .dotfile && ls -A")))
    assert made.output.split() == [".dotfile", "d"]
    assert (await client.send(release_of(lease))).released
    assert (await client.send(release_of(lease))).released is False
    again = await client.send(AcquireRequest(holder=holder("tidy"), ttl_s=60, wait_s=1))
    listing = await client.send(execute_in(again, "ls", ExecOp(command="ls -A | wc -l")))
    assert listing.output.strip() == "0"
    await client.send(release_of(again))


async def test_a_repeated_call_id_is_answered_without_running_again(multi, backend, leases):
    info, client = multi
    lease = await leases()
    command = ExecOp(command="echo ran >> count.txt; wc -l < count.txt")
    first = await client.send(execute_in(lease, "count-1", command))
    again = await client.send(execute_in(lease, "count-1", command))
    concurrent = await asyncio.gather(*(client.send(execute_in(lease, "count-2", command)) for _ in range(3)))
    content = await client.send(execute_in(lease, "read", ReadFileOp(path="count.txt")))
    assert not first.replayed and again.replayed and again.output == first.output == "1\n"
    assert sorted(output.replayed for output in concurrent) == [False, True, True]
    assert {output.output for output in concurrent} == {"2\n"}
    assert content.output == "ran\nran\n"
    root = root_of(backend, info.container_id)
    assert runs_of(root, "count-1") == 1 and runs_of(root, "count-2") == 1


async def test_slots_cannot_see_each_other(multi, backend, leases):
    info, client = multi
    alice, bob = await leases(), await leases()
    await client.send(execute_in(alice, "secret", WriteFileOp(path="secret.txt", content="alice only")))
    alice_path = workspace_of(backend, info.container_id, alice.slot) / "secret.txt"
    assert alice_path.read_text() == "alice only"
    peek_command = f"cat {alice_path}; cat ../slot-{alice.slot}/workspace/secret.txt; ls /"
    peek = await client.send(execute_in(bob, "peek", ExecOp(command=peek_command)))
    assert "alice only" not in peek.output and "No such file or directory" in peek.output
    assert "work" not in peek.output.split() and "root" not in peek.output.split()
    peek_file = ReadFileOp(path=f"../../slot-{alice.slot}/workspace/secret.txt")
    with pytest.raises(BadToolRequest):
        await client.send(execute_in(bob, "peek-file", peek_file))


@needs_bubblewrap
async def test_network_is_off_unless_the_lease_allows_it(leases, multi):
    _, client = multi
    offline, online = await leases(), await leases(allow_network=True)
    with host_listener() as port:
        command = ExecOp(command=f"echo hi > /dev/tcp/127.0.0.1/{port} && echo connected")
        cut = await client.send(execute_in(offline, "net-off", command))
        through = await client.send(execute_in(online, "net-on", command))
    assert not cut.ok and "connected" not in cut.output
    assert through.ok and "connected" in through.output


async def test_a_command_past_its_timeout_dies_with_its_children(multi, backend, leases):
    info, client = multi
    lease = await leases()
    marker = unique_sleep()
    command = ExecOp(command=f"(sleep 1; touch late) & sleep {marker}", timeout_s=0.5)
    output = await client.send(execute_in(lease, "slow", command))
    assert output.timed_out and not output.ok
    await asyncio.sleep(1.2)
    assert not (workspace_of(backend, info.container_id, lease.slot) / "late").exists()
    assert processes_running(marker) == []


async def test_long_output_is_capped(multi, leases):
    _, client = multi
    lease = await leases()
    output = await client.send(execute_in(lease, "flood", ExecOp(command="seq 1 100000")))
    assert output.truncated and len(output.output) <= OUTPUT_CAP
    assert output.output.startswith("1\n2\n") and output.output.endswith("100000\n")


async def test_path_escapes_are_refused_over_http(multi, leases):
    _, client = multi
    lease = await leases()
    with pytest.raises(BadToolRequest):
        await client.send(execute_in(lease, "esc-r", ReadFileOp(path="../../../token")))
    with pytest.raises(BadToolRequest):
        await client.send(execute_in(lease, "esc-w", WriteFileOp(path="/etc/cron.d/x", content="x")))
