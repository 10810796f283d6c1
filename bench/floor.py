"""The floor: what Temporal alone costs per step, with the rollout's shape and none of its work.

FloorWorkflow has TrajectoryWorkflow's sequence of Temporal calls (acquire, setup, then
model turn as an activity and tool call as a local activity until the last turn,
verify, release) but every activity returns at once: no model, no sandbox, no object
store. What a step of it costs, on the worker and on the server, is what any design
that keeps a model turn and a tool call as their own activities pays on this SDK and
server before doing any work; the rollout's own steps cost that plus their work.

The floor's worker runs in the bench process (its own task queue), so its SDK CPU
shows under the `bench` role, not `worker`.
"""

from __future__ import annotations

import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from bench.runs import SLOT_STEPS, Tally, _bounded

FLOOR_QUEUE = "bench-floor"
_OPTIONS = {"start_to_close_timeout": timedelta(seconds=30)}


@activity.defn(name="floor_step")
async def floor_step(key: str) -> str:
    return key


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    @workflow.run
    async def run(self, steps: int) -> int:
        for name in ("acquire", "setup"):
            await workflow.execute_activity(floor_step, name, **_OPTIONS)
        for turn in range(steps + 1):
            await workflow.execute_activity(floor_step, f"turn-{turn}", **_OPTIONS)
            if turn < steps:
                await workflow.execute_local_activity(floor_step, f"call-{turn}", **_OPTIONS)
        for name in ("verify", "release"):
            await workflow.execute_activity(floor_step, name, **_OPTIONS)
        return 2 * steps + 1


assert SLOT_STEPS == 4  # acquire, setup, verify, release above


class FloorRunner:
    """FloorWorkflows started by this client, on a worker in this process."""

    def __init__(self, client: Client) -> None:
        self.client = client
        self.worker = Worker(client, task_queue=FLOOR_QUEUE, workflows=[FloorWorkflow], activities=[floor_step],
                             workflow_runner=UnsandboxedWorkflowRunner(), max_concurrent_activities=1000,
                             max_concurrent_workflow_tasks=100, max_cached_workflows=2000)

    async def __aenter__(self) -> FloorRunner:
        await self.worker.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.worker.__aexit__(*exc)

    async def trajectory(self, steps: int, tally: Tally) -> None:
        started = time.perf_counter()
        done = await self.client.execute_workflow(FloorWorkflow.run, steps, id=f"floor-{uuid.uuid4().hex}",
                                                  task_queue=FLOOR_QUEUE)
        tally.add(steps + 1, done - steps - 1, started)

    async def run(self, concurrency: int, trajectories: int, steps: int) -> Tally:
        return await _bounded(concurrency, trajectories, lambda tally: self.trajectory(steps, tally))
