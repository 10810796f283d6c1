"""How many rollouts one worker holds at once: wall time, efficiency, CPU per step and memory as concurrency grows.

    python bench/scale.py                                  # 10, 100 and 500 at once; 10 steps; 2 s model turns
    python bench/scale.py --concurrency 10 100 500 2000    # the issue's table (2,000 takes about 15 minutes on 2 cores)
    python bench/scale.py --quick                          # 10 and 100 at once, 4 steps, 1 s turns
    python bench/scale.py --set WORKER__TUNER=fixed        # a worker setting (ROLLOUTS_<NAME>) under test
    python bench/scale.py --acquire-only                   # only the acquire cost at 1x8 and 4x500 slots
    python bench/scale.py --cores 1 2 --concurrency 200    # steps/s as the processes get more cores
    python bench/scale.py --concurrency 2000 --start-rate 100  # the batch starts at most 100 rollouts a second

Each level is one BatchWorkflow of N `echo_chain` rollouts with `max_concurrency` N, so all
N start at once, as a trainer submits one step's rollouts (or `--start-rate` a second).
The demo policy answers every model turn after `--delay` seconds, so a rollout of S echo
steps ideally takes (S + 1) x delay (its model turns; tool calls and slot steps are
counted as free), and **efficiency** = that ideal / the wall time of the level. A step
is one model turn or one tool call. The processes are the real ones (bench/procs.py):
`python worker.py`, the dev server with the project's tuning, one sandbox server with N
slots, the demo policy.

Per level it prints wall, efficiency, steps/s, CPU-ms per step by process, each process's
peak RSS during the level, **retried turns** (model requests beyond the turns the
rollouts made: a turn sent again after a missed heartbeat or timeout), and, from the
rollouts' histories, timed-out workflow tasks and model-turn attempts past the first, and the
worker's workflow cache misses and forced evictions over the level (from its metrics endpoint).
Then the acquire cost: worker-side CPU per acquire + release through SandboxPool at 1
container x 8 slots and 4 containers x 500 slots, with half the slots leased. The last
line is one JSON object with the headline figures.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio.api.enums.v1 import TimeoutType

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from bench.procs import TASK_QUEUE, Stack, busy_share, cpu_seconds, host_cpu, run_in_data_dir, services  # noqa: E402
from bench.runs import limits_for  # noqa: E402
from temporal_rollouts.core.settings import PoolOptions, SandboxSettings
from temporal_rollouts.core.records import BatchInput, BatchResult  # noqa: E402
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.schema import Holder  # noqa: E402
from workflows.batch import BatchWorkflow, rollout_id  # noqa: E402

ROLES = ("worker", "temporal", "sandbox", "policy", "bench")
HISTORY_READERS = 16
WARMUP_ROLLOUTS = 20


@dataclass
class Level:
    concurrency: int
    wall_s: float
    ideal_s: float
    steps: int
    completed: int
    failed: int
    cpu_s: dict[str, float]
    peak_rss_mib: dict[str, float]
    host_busy: float
    requests: int
    turns: int
    history: dict[str, int] = field(default_factory=dict)
    cache: dict[str, float] = field(default_factory=dict)  # the worker's sticky cache counters over the level
    cores: int | None = None  # the CPUs the processes were confined to (--cores); None: all

    @property
    def efficiency(self) -> float:
        return self.ideal_s / self.wall_s

    @property
    def steps_per_s(self) -> float:
        return self.steps / self.wall_s

    def cpu_ms_per_step(self, role: str | None = None) -> float:
        used = self.cpu_s.get(role, 0.0) if role else sum(self.cpu_s.values())
        return used * 1000 / max(self.steps, 1)

    def row(self) -> str:
        cpu = "".join(f"{self.cpu_ms_per_step(role):8.2f}" for role in ROLES)
        rss = "/".join(f"{self.peak_rss_mib.get(role, 0):.0f}" for role in ROLES[:4])
        return (
            f"{self.concurrency:6d}{self.wall_s:8.1f}{100 * self.efficiency:6.0f}%{self.steps_per_s:8.1f} |{cpu}"
            f"{self.cpu_ms_per_step():8.2f}{100 * self.host_busy:6.0f}% | {rss:>19} |{self.requests - self.turns:7d}"
            f"{self.history.get('llm_turn_retries', 0):7d}{self.history.get('workflow_task_timeouts', 0):7d}"
            f"{self.history.get('sticky_schedule_to_start_timeouts', 0):7d}"
            f"{self.failed:6d} |{self.cache.get('misses', 0):7.0f}{self.cache.get('evictions', 0):7.0f}"
        )

    def figures(self) -> dict:
        return {
            "concurrency": self.concurrency,
            "cores": self.cores,
            "wall_s": round(self.wall_s, 2),
            "efficiency": round(self.efficiency, 3),
            "steps_per_s": round(self.steps_per_s, 1),
            "cpu_ms_per_step": round(self.cpu_ms_per_step(), 2),
            "cpu_ms_per_step_by_process": {r: round(self.cpu_ms_per_step(r), 2) for r in ROLES},
            "peak_rss_mib": self.peak_rss_mib,
            "retried_requests": self.requests - self.turns,
            "completed": self.completed,
            "failed": self.failed,
            "workflow_cache_misses": self.cache.get("misses"),
            "workflow_cache_forced_evictions": self.cache.get("evictions"),
            **self.history,
        }


HEADER = (
    "  at once  wall s   eff  steps/s | CPU ms per step, by process" + " " * 26 + "host | peak RSS MiB        "
    "| retried  turn   WFT sticky failed | wf cache\n"
    + " " * 34
    + "|"
    + "".join(f"{r:>8}" for r in ROLES)
    + "   total  busy"
    " | wrk/tmp/sbx/pol     | reqs   tries  t/o    t/o       |  miss  evict"
)


def _peak_rss_reset(pid: int) -> None:
    """Start a fresh high-water mark of the process's resident memory (Linux: clear_refs 5)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def _peak_rss_mib(pid: int) -> float:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return round(int(line.split()[1]) / 1024, 1)
    return 0.0


async def _policy_requests(stack: Stack) -> int:
    async with httpx.AsyncClient(timeout=30) as http:
        return (await http.get(f"http://127.0.0.1:{stack.settings.demo_policy.port}/stats")).json()["total"]


async def _history_counts(stack: Stack, batch_id: str, rollouts: int) -> dict[str, int]:
    """Timed-out workflow tasks (the batch's and every rollout's) and model-turn attempts past the first."""
    counts = {
        "workflow_task_timeouts": 0,
        "sticky_schedule_to_start_timeouts": 0,
        "llm_turn_retries": 0,
        "activity_timeouts": 0,
    }
    gate = asyncio.Semaphore(HISTORY_READERS)

    async def read(workflow_id: str) -> None:
        async with gate:
            history = await stack.client.get_workflow_handle(workflow_id).fetch_history()
        scheduled: dict[int, str] = {}
        for event in history.events:
            if event.HasField("workflow_task_timed_out_event_attributes"):
                counts["workflow_task_timeouts"] += 1
                # A task that waited on the worker's sticky queue too long (the worker was behind), as
                # opposed to one the worker took and did not finish in time.
                if (
                    event.workflow_task_timed_out_event_attributes.timeout_type
                    == TimeoutType.TIMEOUT_TYPE_SCHEDULE_TO_START
                ):
                    counts["sticky_schedule_to_start_timeouts"] += 1
            elif event.HasField("activity_task_timed_out_event_attributes"):
                counts["activity_timeouts"] += 1
            elif event.HasField("activity_task_scheduled_event_attributes"):
                scheduled[event.event_id] = event.activity_task_scheduled_event_attributes.activity_type.name
            elif event.HasField("activity_task_started_event_attributes"):
                started = event.activity_task_started_event_attributes
                if scheduled.get(started.scheduled_event_id) == "llm_turn" and started.attempt > 1:
                    counts["llm_turn_retries"] += started.attempt - 1

    await asyncio.gather(read(batch_id), *(read(rollout_id(batch_id, i, 0)) for i in range(rollouts)))
    return counts


async def run_level(
    stack: Stack,
    concurrency: int,
    steps: int,
    delay_s: float,
    histories: bool,
    start_rate: float = 0.0,
    processes: int = 1,
) -> Level:
    pids = {"bench": os.getpid(), **stack.pids}
    for pid in pids.values():
        _peak_rss_reset(pid)
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    requests_before, host_before = await _policy_requests(stack), host_cpu()
    cache_before = await stack.worker_cache(processes)
    batch_id = f"scale-{concurrency}-{uuid.uuid4().hex[:6]}"
    batch = BatchInput(
        env="echo_chain",
        num_items=concurrency,
        group_size=1,
        max_concurrency=concurrency,
        env_config={"steps": steps},
        limits=limits_for(steps),
        start_rate=start_rate,
    )
    started = time.perf_counter()
    result = BatchResult.model_validate(
        await stack.client.execute_workflow(BatchWorkflow.run, batch, id=batch_id, task_queue=TASK_QUEUE)
    )
    wall = time.perf_counter() - started
    host_after = host_cpu()
    level = Level(
        concurrency=concurrency,
        wall_s=wall,
        ideal_s=(steps + 1) * delay_s,
        steps=concurrency * (2 * steps + 1),
        completed=result.completed,
        failed=result.failed,
        cpu_s={role: cpu_seconds(pid) - before[role] for role, pid in pids.items()},
        peak_rss_mib={role: _peak_rss_mib(pid) for role, pid in pids.items()},
        host_busy=busy_share(host_before, host_after),
        requests=await _policy_requests(stack) - requests_before,
        turns=concurrency * (steps + 1),
        cache={name: n - cache_before[name] for name, n in (await stack.worker_cache(processes)).items()},
    )
    if histories:
        level.history = await _history_counts(stack, batch_id, concurrency)
    return level


async def acquire_cost(data_dir: Path, containers: int, slots: int, rounds: int) -> float:
    """Worker-side CPU-ms per acquire + release through SandboxPool, with half the slots leased."""
    backend = LocalBackend(
        data_dir / f"acquire-{containers}x{slots}",
        SandboxSettings(slots_per_container=slots, backend={"start_containers": False}),
    )
    started = [await backend.start_container() for _ in range(containers)]
    pool = SandboxPool(backend, PoolOptions(max_containers=containers))
    try:
        held = [
            await pool.acquire(Holder(workflow_id=f"held-{i}", run_id="r"), wait_s=5)
            for i in range(containers * slots // 2)
        ]
        for warm in range(5):
            await pool.release(await pool.acquire(Holder(workflow_id=f"warm-{warm}", run_id="r"), wait_s=5))
        cpu = time.process_time()
        for round_ in range(rounds):
            lease = await pool.acquire(Holder(workflow_id=f"bench-{round_}", run_id="r"), wait_s=5, may_hold=False)
            await pool.release(lease)
        per_op = (time.process_time() - cpu) * 1000 / rounds
        for lease in held:
            await pool.release(lease)
        return per_op
    finally:
        await pool.aclose()
        for info in started:
            await backend.stop_container(info.container_id)


async def run_stack(args, data_dir: Path, cores: int | None, every_cpu: set[int]) -> list[Level]:
    """Every level against one fresh set of processes; with `cores`, all of them (and this
    process) confined to the first `cores` of `every_cpu`, with as many worker processes."""
    worker_env = dict(("ROLLOUTS_" + name, value) for name, _, value in (s.partition("=") for s in args.set))
    if cores is not None:
        os.sched_setaffinity(0, sorted(every_cpu)[:cores])  # the processes started next inherit it
        worker_env.setdefault("ROLLOUTS_WORKER__PROCESSES", str(cores))
    where = f"{cores} of {os.cpu_count()} CPUs" if cores else f"{os.cpu_count()} CPUs"
    folder = data_dir / f"cores-{cores or 'all'}"
    folder.mkdir()
    async with services(
        folder,
        slots=max(args.concurrency),
        worker="process",
        db_file=args.db_file,
        policy_args=("--delay-s", str(args.delay)),
        worker_env=worker_env,
    ) as stack:
        print(
            f"{where}, load average {os.getloadavg()[0]:.2f}; echo_chain x {args.steps} steps "
            f"({2 * args.steps + 1} steps a rollout, ideal {(args.steps + 1) * args.delay:.1f} s); model turns "
            f"{args.delay:g} s; start_rate {args.start_rate:g}; sandbox 1 x {max(args.concurrency)} slots; "
            f"worker settings {sorted(worker_env.items()) or 'defaults'}",
            flush=True,
        )
        # Warm-up (imports, pools, caches): a few short rollouts, not the smallest level, which may be 2,000.
        await run_level(stack, min(min(args.concurrency), WARMUP_ROLLOUTS), 2, 0.0, histories=False)
        print(HEADER)
        levels = []
        for concurrency in args.concurrency:
            level = await run_level(
                stack,
                concurrency,
                args.steps,
                args.delay,
                histories=not args.no_histories,
                start_rate=args.start_rate,
                processes=int(worker_env.get("ROLLOUTS_WORKER__PROCESSES", "1")),
            )
            level.cores = cores
            levels.append(level)
            print(level.row(), flush=True)
    return levels


async def amain(args, data_dir: Path) -> dict:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    figures: dict = {
        "cpus": os.cpu_count(),
        "steps": args.steps,
        "delay_s": args.delay,
        "settings": args.set,
        "start_rate": args.start_rate,
    }
    if not args.acquire_only:
        every_cpu = os.sched_getaffinity(0)
        levels = []
        try:
            for cores in args.cores or [None]:
                levels += await run_stack(args, data_dir, cores, every_cpu)
                print(flush=True)
        finally:
            os.sched_setaffinity(0, every_cpu)
        figures["levels"] = [level.figures() for level in levels]
        if args.cores and len(args.cores) > 1:
            print("steps/s by CPUs (as many worker processes), against the fewest:")
            for concurrency in args.concurrency:
                rates = {lv.cores: lv.steps_per_s for lv in levels if lv.concurrency == concurrency}
                base = rates[min(rates)]
                shares = (
                    f"{n} CPU{'s' if n > 1 else ''} {rate:.1f} (x{rate / base:.2f})"
                    for n, rate in sorted(rates.items())
                )
                print(f"  {concurrency:6d} at once: " + ", ".join(shares))
    print("\nacquire + release, worker CPU-ms each (half the slots leased):", flush=True)
    figures["acquire_cpu_ms"] = {}
    for containers, slots in ((1, 8), (4, 500)):
        cost = await acquire_cost(data_dir, containers, slots, args.acquire_rounds)
        figures["acquire_cpu_ms"][f"{containers}x{slots}"] = round(cost, 2)
        print(f"  {containers} x {slots:3d} slots: {cost:6.2f}", flush=True)
    return figures


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--concurrency",
        type=int,
        nargs="+",
        help="rollouts at once, one level per value (default 10 100 500; 10 100 with --quick)",
    )
    parser.add_argument("--steps", type=int, help="echo steps per rollout (default 10; 4 with --quick)")
    parser.add_argument(
        "--delay", type=float, help="seconds the policy takes per model turn (default 2; 1 with --quick)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a worker setting as its ROLLOUTS_ variable without the prefix, e.g. WORKER__TUNER=fixed",
    )
    parser.add_argument(
        "--cores",
        type=int,
        nargs="+",
        help="run every level once per value, all processes confined "
        "to that many CPUs and the worker started with that many processes (e.g. --cores 1 2)",
    )
    parser.add_argument("--db-file", action="store_true", help="dev server on an SQLite file instead of in memory")
    parser.add_argument(
        "--start-rate",
        type=float,
        default=0.0,
        metavar="PER_S",
        help="the batch's start_rate: rollouts started per second at most (default 0: all at once)",
    )
    parser.add_argument("--no-histories", action="store_true", help="skip reading the rollouts' histories")
    parser.add_argument("--acquire-only", action="store_true", help="only the acquire cost at 1x8 and 4x500 slots")
    parser.add_argument("--acquire-rounds", type=int, default=200)
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs, databases)")
    parser.add_argument("--quick", action="store_true")
    quiet.add_argument(parser)
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or ([10, 100] if args.quick else [10, 100, 500])
    args.steps = args.steps or (4 if args.quick else 10)
    args.delay = args.delay if args.delay is not None else (1.0 if args.quick else 2.0)
    if any("=" not in s for s in args.set):
        parser.error("--set takes NAME=VALUE")
    if args.cores and not all(1 <= cores <= len(os.sched_getaffinity(0)) for cores in args.cores):
        parser.error(f"--cores takes 1 to {len(os.sched_getaffinity(0))} (the CPUs this process may use)")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    host = quiet.check_host(args.allow_busy)

    async def measured(data_dir: Path) -> None:
        print(json.dumps(await amain(args, data_dir) | host.report()))

    return run_in_data_dir("bench-scale-", args.keep, measured)


if __name__ == "__main__":
    sys.exit(main())
