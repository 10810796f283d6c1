"""`POST /slots/copy`: a slot takes another slot's workspace inside one container (how a branch of a
rollout starts from its parent's files), on a real sandbox server process."""

from __future__ import annotations

import pytest

from temporal_rollouts.core.errors import BadToolRequest, LeaseLost, TransferTooLarge
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, SlotRef
from tests.support.sandbox import ONE_CONTAINER


@pytest.fixture
async def two_slots(backend):
    """Two leases on one two-slot container."""
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        await pool.fleet.ensure_running()
        parent = await pool.acquire(Holder(workflow_id="parent"), ttl_s=120, wait_s=5)
        branch = await pool.acquire(Holder(workflow_id="branch"), ttl_s=120, wait_s=5)
        assert parent.container_id == branch.container_id
        yield pool, parent.ref(), branch.ref()
        await pool.release(parent)
        await pool.release(branch)


async def run(pool: SandboxPool, slot: SlotRef, call_id: str, command: str) -> str:
    output = await pool.lease(slot).execute(call_id, ExecOp(command=command, timeout_s=30))
    assert output.ok, output
    return output.output


async def test_a_slot_takes_a_copy_of_another_slots_workspace(two_slots) -> None:
    pool, parent, branch = two_slots
    await run(
        pool,
        parent,
        "p-build",
        "mkdir -p src/pkg && echo one > src/pkg/a.txt && printf '#!/bin/sh\\necho hi\\n' > "
        "run.sh && chmod 755 run.sh && ln -s src/pkg/a.txt link && echo x > .hidden",
    )
    await run(pool, branch, "b-leftover", "echo stale > leftover.txt")

    copied = await pool.lease(branch).copy_from(parent)

    assert copied.entries >= 5 and copied.bytes > 0
    listing = await run(
        pool, branch, "b-list", "find . -mindepth 1 | sort; readlink link; ./run.sh; cat src/pkg/a.txt .hidden"
    )
    assert "leftover.txt" not in listing, "the copy replaces the workspace, it does not merge into it"
    assert "./src/pkg/a.txt" in listing and "src/pkg/a.txt\nhi\none\nx" in listing
    await run(pool, branch, "b-change", "echo two >> src/pkg/a.txt")
    assert await run(pool, parent, "p-read", "cat src/pkg/a.txt") == "one\n", "the branch's files are its own"


async def test_a_copy_is_refused_onto_itself_without_the_source_lease_or_over_its_limit(two_slots) -> None:
    pool, parent, branch = two_slots
    await run(pool, parent, "p-big", "head -c 200000 /dev/urandom > blob")
    with pytest.raises(BadToolRequest, match="onto itself"):
        await pool.lease(parent).copy_from(parent)
    with pytest.raises(LeaseLost):
        await pool.lease(branch).copy_from(parent.model_copy(update={"lease_id": "not-the-lease"}))
    with pytest.raises(TransferTooLarge):
        await pool.lease(branch).copy_from(parent, max_bytes=50_000)
    with pytest.raises(ValueError, match="another container"):
        await pool.lease(branch).copy_from(parent.model_copy(update={"container_id": "elsewhere"}))
