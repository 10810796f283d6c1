"""Small helpers many tests use: fresh batch ids, the leased slots of a pool, waiting for a condition."""

from __future__ import annotations

import asyncio
import inspect
import uuid

from temporal_rollouts.sandbox.pool import SandboxPool


def batch_id(prefix: str = "batch") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def leased_slots(pool: SandboxPool) -> list:
    states = await pool.placement.look()
    return [s for slots in states.values() for s in slots if s.lease is not None]


async def no_leases(pool: SandboxPool) -> bool:
    """No slot of the pool is leased (a condition for `wait_until`)."""
    return await leased_slots(pool) == []


async def reap_closed_holders(pool: SandboxPool, client) -> list:
    """Run the reaper's check as `python worker.py` does: free every lease whose holder run has closed
    (a run terminated from outside never releases its own slot)."""
    from temporalio.client import WorkflowExecutionStatus

    async def holder_closed(holder) -> bool:
        described = await client.get_workflow_handle(holder.workflow_id, run_id=holder.run_id).describe()
        return described.status != WorkflowExecutionStatus.RUNNING

    return await pool.reap(holder_closed)


async def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.1):
    """The predicate's first truthy value (it may be a plain function or return an awaitable); an
    AssertionError once `timeout_s` has passed."""
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)
