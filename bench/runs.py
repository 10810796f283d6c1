"""The same echo_chain trajectories, run two ways: plain asyncio, and as Temporal workflows.

Both variants do the same work against the same processes: lease a slot through the
SandboxPool, set the workspace up through the env, then model turn (llm.chat.ChatClient
against the demo policy) and tool call (parse_tool_call + a lease's execute) until the
model stops calling tools, verify, release. The asyncio variant does it in this
process with no Temporal; the Temporal variant runs TrajectoryWorkflow (started
directly, or as children of one BatchWorkflow), each step an activity on the worker.
"""

from __future__ import annotations

import asyncio
import itertools
import time
import uuid
from dataclasses import dataclass, field

from envs import get_env
from temporal_rollouts.core.messages import estimate_tokens
from temporal_rollouts.core.records import BatchInput, RolloutLimits, TrajectoryInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.llm.chat import ChatClient
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder
from temporal_rollouts.tools.catalogue import ToolCallProblem, parse_tool_call, tool_result_message
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

ENV = "echo_chain"
SLOT_STEPS = 4  # acquire, setup, verify, release: activities too, but not counted as steps
_items = itertools.count()


@dataclass
class Tally:
    """What one run did: model turns, tool calls, how long each trajectory took."""

    turns: int = 0
    tool_calls: int = 0
    trajectories: int = 0
    durations: list[float] = field(default_factory=list)

    @property
    def steps(self) -> int:
        return self.turns + self.tool_calls

    def add(self, turns: int, tool_calls: int, started: float) -> None:
        self.turns, self.tool_calls, self.trajectories = (
            self.turns + turns,
            self.tool_calls + tool_calls,
            self.trajectories + 1,
        )
        self.durations.append(time.perf_counter() - started)


def limits_for(steps: int) -> RolloutLimits:
    return RolloutLimits(max_turns=steps + 1, max_tool_calls=max(steps, 1))


def next_item(steps: int) -> Item:
    return Item(id=f"echo-{next(_items)}", data={"steps": steps})


class AsyncioRunner:
    """The trajectory loop of TrajectoryWorkflow, as plain coroutines over the same clients."""

    def __init__(self, settings: Settings, pool: SandboxPool) -> None:
        self.settings, self.pool = settings, pool
        endpoint = settings.policy_endpoint(None)  # what LlmActivities resolves for the default (demo) policy
        self.chat = ChatClient(base_url=endpoint.base_url, model=endpoint.model, timeout_s=endpoint.timeout_s)

    async def aclose(self) -> None:
        await self.chat.aclose()

    async def trajectory(self, steps: int, tally: Tally) -> None:
        started = time.perf_counter()
        env, item, limits = get_env(ENV, {"steps": steps}), next_item(steps), limits_for(steps)
        key = f"asyncio-{uuid.uuid4().hex}"
        sandbox = self.settings.sandbox
        # No workflow id: the slot reaper leaves leases held outside a workflow alone.
        lease = await self.pool.acquire(
            Holder(workflow_id="", run_id=key),
            ttl_s=sandbox.lease_ttl_s,
            wait_s=sandbox.acquire_timeout_s,
            allow_network=env.allow_network,
        )
        turns = tool_calls = 0
        try:
            await env.setup_workspace(item, LeasedSlot(self.pool, lease, f"{key}/setup"))
            messages, tools = env.prompt_messages(item), env.tool_specs()
            names = [tool.name for tool in tools]
            while turns < limits.max_turns and estimate_tokens(messages) < limits.context_tokens:
                reply = await self.chat.complete(messages, tools, temperature=1.0)
                turns += 1
                messages.append(reply.message)
                if not reply.message.tool_calls:
                    break
                for index, call in enumerate(reply.message.tool_calls):
                    op = parse_tool_call(call, names, default_timeout_s=limits.command_timeout_s)
                    if not isinstance(op, ToolCallProblem):
                        op = await self.pool.lease(lease).execute(f"{key}/turn-{turns}/call-{index}", op)
                    messages.append(tool_result_message(call.id, op))
                    tool_calls += 1
            verdict = await env.verify(item, LeasedSlot(self.pool, lease, f"{key}/verify"), messages)
            assert verdict.score == 1.0, verdict
        finally:
            await self.pool.release(lease)
        tally.add(turns, tool_calls, started)

    async def run(self, concurrency: int, trajectories: int, steps: int) -> Tally:
        return await run_bounded(concurrency, trajectories, lambda tally: self.trajectory(steps, tally))


class TemporalRunner:
    """TrajectoryWorkflows on the worker: started by this client (`direct`) or by one BatchWorkflow (`batch`)."""

    def __init__(self, client, task_queue: str, via: str) -> None:
        self.client, self.task_queue, self.via = client, task_queue, via

    async def trajectory(self, steps: int, tally: Tally) -> None:
        started = time.perf_counter()
        rollout = TrajectoryInput(env=ENV, item=next_item(steps), env_config={"steps": steps}, limits=limits_for(steps))
        result = await self.client.execute_workflow(
            TrajectoryWorkflow.run, rollout, id=f"bench-{uuid.uuid4().hex}", task_queue=self.task_queue
        )
        assert result.score == 1.0, result
        tally.add(result.turns, result.tool_calls, started)

    async def run(self, concurrency: int, trajectories: int, steps: int) -> Tally:
        if self.via == "direct":
            return await run_bounded(concurrency, trajectories, lambda tally: self.trajectory(steps, tally))
        tally, started = Tally(), time.perf_counter()
        batch = BatchInput(
            env=ENV,
            num_items=trajectories,
            item_offset=next(_items),
            group_size=1,
            env_config={"steps": steps},
            limits=limits_for(steps),
            max_concurrency=concurrency,
        )
        result = await self.client.execute_workflow(
            BatchWorkflow.run, batch, id=f"bench-batch-{uuid.uuid4().hex}", task_queue=self.task_queue
        )
        assert result.completed == trajectories and result.mean_score == 1.0, result
        tally.turns, tally.tool_calls, tally.trajectories = (
            trajectories * (steps + 1),
            trajectories * steps,
            trajectories,
        )
        tally.durations = [time.perf_counter() - started]  # per-trajectory times are not visible from here
        return tally


async def run_bounded(concurrency: int, trajectories: int, one) -> Tally:
    """Run `trajectories` calls of `one`, `concurrency` at a time (a new one starts as one ends)."""
    tally, gate = Tally(), asyncio.Semaphore(concurrency)

    async def guarded() -> None:
        async with gate:
            await one(tally)

    await asyncio.gather(*(guarded() for _ in range(trajectories)))
    return tally
