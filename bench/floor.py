"""The floor: what Temporal alone costs per step, with the rollout's shape and none of its work.

    python bench/floor.py                                        # 150 and 2,000 at once, 10 steps, 2 s turns
    python bench/floor.py --concurrency 200 2000 --steps 2 --delay 2

FloorWorkflow makes TrajectoryWorkflow's sequence of Temporal calls (acquire, setup,
then a model turn as an activity and a tool call as a local activity until the last
turn, verify, release), but its activities do nothing except, for a model turn, sleep
`--delay` seconds as the demo policy does. No model, no sandbox, no object store. What
a step of it costs on the worker and on the server is what any design that keeps a
model turn and a tool call as their own activities pays on this SDK and server before
doing any work; a rollout's step costs that plus its work. Likewise its efficiency at a
level bounds what real rollouts can reach there on this machine.

Run alone, each level is one parent workflow that starts its N FloorWorkflows at once,
as a BatchWorkflow does, against the embedded dev server's tuning (in-memory SQLite).
`bench/orchestration.py --floor` runs it as a third variant beside the real rollouts.
The floor's worker runs in this process, so its SDK CPU is counted as this process's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from bench.procs import busy_share, cpu_seconds, host_cpu, run_in_data_dir, temporal_dev_server  # noqa: E402
from bench.quiet import HostBefore  # noqa: E402
from bench.runs import SLOT_STEPS, Tally, run_bounded  # noqa: E402

FLOOR_QUEUE = "bench-floor"
_OPTIONS = {"start_to_close_timeout": timedelta(minutes=10)}


@activity.defn(name="floor_step")
async def floor_step(key: str, delay_s: float) -> str:
    if delay_s:
        await asyncio.sleep(delay_s)
    return key


@workflow.defn(name="FloorWorkflow")
class FloorWorkflow:
    @workflow.run
    async def run(self, steps: int, delay_s: float = 0.0) -> int:
        for name in ("acquire", "setup"):
            await workflow.execute_activity(floor_step, args=[name, 0.0], **_OPTIONS)
        for turn in range(steps + 1):
            await workflow.execute_activity(floor_step, args=[f"turn-{turn}", delay_s], **_OPTIONS)
            if turn < steps:
                await workflow.execute_local_activity(floor_step, args=[f"call-{turn}", 0.0], **_OPTIONS)
        for name in ("verify", "release"):
            await workflow.execute_activity(floor_step, args=[name, 0.0], **_OPTIONS)
        return 2 * steps + 1


assert SLOT_STEPS == 4  # acquire, setup, verify, release above


@workflow.defn(name="FloorBatchWorkflow")
class FloorBatchWorkflow:
    """N FloorWorkflows started in one workflow task, as BatchWorkflow starts a level's rollouts."""

    @workflow.run
    async def run(self, rollouts: int, steps: int, delay_s: float) -> int:
        batch = workflow.info().workflow_id
        done = await asyncio.gather(
            *(
                workflow.execute_child_workflow(FloorWorkflow.run, args=[steps, delay_s], id=f"{batch}-{i}")
                for i in range(rollouts)
            )
        )
        return sum(done)


class FloorRunner:
    """FloorWorkflows on a worker in this process: started by this client, or by one FloorBatchWorkflow."""

    def __init__(self, client: Client, delay_s: float = 0.0) -> None:
        self.client, self.delay_s = client, delay_s
        self.worker = Worker(
            client,
            task_queue=FLOOR_QUEUE,
            workflows=[FloorWorkflow, FloorBatchWorkflow],
            activities=[floor_step],
            workflow_runner=UnsandboxedWorkflowRunner(),
            max_concurrent_activities=1000,
            max_concurrent_workflow_tasks=100,
            max_cached_workflows=4000,
        )

    async def __aenter__(self) -> FloorRunner:
        await self.worker.__aenter__()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.worker.__aexit__(*exc)

    async def trajectory(self, steps: int, tally: Tally) -> None:
        started = time.perf_counter()
        done = await self.client.execute_workflow(
            FloorWorkflow.run, args=[steps, self.delay_s], id=f"floor-{uuid.uuid4().hex}", task_queue=FLOOR_QUEUE
        )
        tally.add(steps + 1, done - steps - 1, started)

    async def run(self, concurrency: int, trajectories: int, steps: int) -> Tally:
        return await run_bounded(concurrency, trajectories, lambda tally: self.trajectory(steps, tally))

    async def batch(self, rollouts: int, steps: int) -> int:
        return await self.client.execute_workflow(
            FloorBatchWorkflow.run,
            args=[rollouts, steps, self.delay_s],
            id=f"floor-batch-{uuid.uuid4().hex}",
            task_queue=FLOOR_QUEUE,
        )


async def amain(args, data_dir: Path, host: HostBefore) -> dict:
    figures: dict = {"cpus": os.cpu_count(), "steps": args.steps, "delay_s": args.delay, "levels": []}
    async with temporal_dev_server(data_dir) as (env, server_pid):
        async with FloorRunner(env.client, args.delay) as runner:
            await runner.batch(min(50, min(args.concurrency)), 2)  # warm-up: imports, connections, caches
            ideal = (args.steps + 1) * args.delay
            print(
                f"{os.cpu_count()} CPUs; FloorWorkflow x {args.steps} steps ({2 * args.steps + 1} steps a rollout, "
                f"ideal {ideal:.1f} s); model turns {args.delay:g} s; dev server pid {server_pid}"
            )
            print("  at once  wall s   eff  steps/s | CPU ms per step: server  SDK (worker + client)  total  host busy")
            for n in args.concurrency:
                pids = {"server": server_pid, "sdk": os.getpid()}
                before, host_before = {role: cpu_seconds(pid) for role, pid in pids.items()}, host_cpu()
                started = time.perf_counter()
                steps = await runner.batch(n, args.steps)
                wall = time.perf_counter() - started
                host_after = host_cpu()
                cpu = {role: (cpu_seconds(pid) - before[role]) * 1000 / steps for role, pid in pids.items()}
                busy = busy_share(host_before, host_after)
                eff = ideal / wall if ideal else float("nan")
                print(
                    f"  {n:7d}{wall:8.1f}{100 * eff:5.0f}%{steps / wall:9.1f} |{cpu['server']:23.2f}"
                    f"{cpu['sdk']:23.2f}{sum(cpu.values()):7.2f}{100 * busy:10.0f}%",
                    flush=True,
                )
                figures["levels"].append(
                    {
                        "concurrency": n,
                        "wall_s": round(wall, 2),
                        "efficiency": round(eff, 3),
                        "steps_per_s": round(steps / wall, 1),
                        "cpu_ms_per_step": {k: round(v, 2) for k, v in cpu.items()},
                        "host_busy": round(busy, 3),
                    }
                )
    return figures | host.report()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[150, 2000], help="rollouts at once, one level each"
    )
    parser.add_argument("--steps", type=int, default=10, help="echo-like steps per rollout (2 x steps + 1 counted)")
    parser.add_argument("--delay", type=float, default=2.0, help="seconds each model turn sleeps")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs)")
    quiet.add_argument(parser)
    args = parser.parse_args(argv)
    host = quiet.check_host(args.allow_busy)

    async def measured(data_dir: Path) -> None:
        print(json.dumps(await amain(args, data_dir, host)))

    return run_in_data_dir("bench-floor-", args.keep, measured)


if __name__ == "__main__":
    sys.exit(main())
