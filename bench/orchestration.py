"""What Temporal costs per rollout step: the same echo_chain trajectories through plain asyncio and through Temporal.

    python bench/orchestration.py                          # concurrency 1 and 200, 10 steps per trajectory
    python bench/orchestration.py --quick                  # a short run
    python bench/orchestration.py --concurrency 1 50 200 --trajectories 20 100 400 --repeat 3
    python bench/orchestration.py --quick --floor          # also Temporal's floor (bench/floor.py)

A step is one model turn or one tool call (a trajectory of N echo steps has N+1 turns and
N tool calls); acquire, setup, verify and release run in both variants but are not counted
as steps. Both variants of a level run in the same process against the same servers, one
after the other (alternating which goes first when --repeat > 1). See bench/README.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from bench.quiet import HostBefore  # noqa: E402
from bench.floor import FloorRunner  # noqa: E402
from bench.procs import TASK_QUEUE, Stack, busy_share, cpu_seconds, host_cpu, run_in_data_dir, services  # noqa: E402
from bench.runs import SLOT_STEPS, AsyncioRunner, Tally, TemporalRunner  # noqa: E402

ROLES = ("bench", "worker", "temporal", "sandbox", "policy")
TARGET_OVERHEAD_MS, TARGET_STEPS_S = 10.0, 180.0


@dataclass
class Measured:
    variant: str
    wall_s: float
    tally: Tally
    cpu_s: dict[str, float]
    host_busy: float  # fraction of the whole machine's CPU that was busy, whoever used it

    @property
    def steps_per_s(self) -> float:
        return self.tally.steps / self.wall_s

    def row(self, per_trajectory: bool) -> str:
        t = self.tally
        latency = statistics.mean(t.durations) / (t.steps / t.trajectories) * 1000 if per_trajectory else float("nan")
        cpu = "".join(f"{self.cpu_s.get(role, 0.0) * 1000 / t.steps:9.2f}" for role in ROLES)
        total = sum(self.cpu_s.values())
        return (
            f"  {self.variant:9}{self.wall_s:8.2f}{t.steps:8d}{self.steps_per_s:9.1f}{latency:9.2f} |{cpu}"
            f"{total * 1000 / t.steps:8.2f}{100 * total / self.wall_s / os.cpu_count():6.0f}%{100 * self.host_busy:6.0f}%"
        )


HEADER = (
    "  variant    wall s   steps  steps/s  ms/step | CPU ms per step, by process\n"
    + " " * 46
    + "|"
    + "".join(f"{role:>9}" for role in ROLES)
    + "   total  ours  host"
)


async def measure(name: str, runner, stack: Stack, concurrency: int, trajectories: int, steps: int) -> Measured:
    pids = {"bench": os.getpid(), **stack.pids}
    before = {role: cpu_seconds(pid) for role, pid in pids.items()}
    host_before = host_cpu()
    started = time.perf_counter()
    tally = await runner.run(concurrency, trajectories, steps)
    wall = time.perf_counter() - started
    expected = trajectories * (2 * steps + 1)
    assert tally.steps == expected and tally.trajectories == trajectories, (tally.steps, expected)
    host_after = host_cpu()
    host_busy = busy_share(host_before, host_after)
    return Measured(name, wall, tally, {role: cpu_seconds(pid) - before[role] for role, pid in pids.items()}, host_busy)


def compare(a: Measured, t: Measured, concurrency: int, steps: int) -> dict:
    n = a.tally.steps
    per_traj = 2 * steps + 1
    extra_ms = (t.wall_s - a.wall_s) * 1000 / n
    per_activity = extra_ms * per_traj / (per_traj + SLOT_STEPS)
    cpu_extra = (sum(t.cpu_s.values()) - sum(a.cpu_s.values())) * 1000 / n
    ratio = t.steps_per_s / a.steps_per_s
    print(
        f"  => orchestration cost {extra_ms:+.2f} ms per step ({per_activity:+.2f} ms per activity counting "
        f"acquire/setup/verify/release), {cpu_extra:+.2f} CPU-ms per step; throughput temporal/asyncio = {ratio:.2f}"
    )
    return {
        "c": concurrency,
        "asyncio": a.steps_per_s,
        "temporal": t.steps_per_s,
        "ratio": ratio,
        "extra_ms": extra_ms,
        "cpu": {name: sum(m.cpu_s.values()) * 1000 / n for name, m in (("asyncio", a), ("temporal", t))},
    }


async def run_level(stack: Stack, runners: dict, args, concurrency: int, trajectories: int) -> dict:
    print(
        f"\n== concurrency {concurrency}: {trajectories} trajectories x {args.steps} echo steps "
        f"({2 * args.steps + 1} steps each), load average {os.getloadavg()[0]:.2f}"
    )
    print(HEADER)
    variants = [name for name in ("asyncio", "temporal", "floor") if name in runners]
    results: dict[str, list[Measured]] = {name: [] for name in variants}
    for repeat in range(args.repeat):
        for name in variants if repeat % 2 == 0 else variants[::-1]:
            measured = await measure(name, runners[name], stack, concurrency, trajectories, args.steps)
            results[name].append(measured)
            print(measured.row(per_trajectory=name == "asyncio" or args.via == "direct"), flush=True)
    median = {name: sorted(runs, key=lambda m: m.wall_s)[len(runs) // 2] for name, runs in results.items()}
    if args.repeat > 1:
        print("  median:")
        for name in variants:
            print(median[name].row(per_trajectory=name == "asyncio" or args.via == "direct"))
    row = compare(median["asyncio"], median["temporal"], concurrency, args.steps)
    if "floor" in median:
        row["floor"] = floor_figures(median["floor"], median["temporal"])
    return row


def floor_figures(floor: Measured, temporal: Measured) -> dict:
    """Temporal's own cost per step (bench/floor.py), against what the rollouts' steps cost."""
    n = floor.tally.steps
    server = floor.cpu_s.get("temporal", 0.0) * 1000 / n
    sdk = floor.cpu_s.get("bench", 0.0) * 1000 / n  # the floor's worker and client run in the bench process
    total = server + sdk
    rollouts = sum(temporal.cpu_s.values()) * 1000 / temporal.tally.steps
    print(
        f"  => Temporal's floor: {total:.2f} CPU-ms per step ({server:.2f} server, {sdk:.2f} SDK worker + client), "
        f"{floor.steps_per_s:.1f} steps/s; the rollouts' steps cost {rollouts:.2f}, {rollouts - total:+.2f} above it"
    )
    return {"cpu": total, "server": server, "sdk": sdk, "steps_per_s": floor.steps_per_s}


def summary(rows: list[dict], host: HostBefore) -> None:
    print("\n== summary (median runs)")
    print("  concurrency  asyncio steps/s  temporal steps/s  temporal/asyncio  cost ms/step  target")
    for r in rows:
        if r["c"] == 1:
            target = (
                f"<= {TARGET_OVERHEAD_MS:.0f} ms/step: {'met' if r['extra_ms'] <= TARGET_OVERHEAD_MS else 'NOT met'}"
            )
        elif r["c"] >= 200:
            target = f">= {TARGET_STEPS_S:.0f} steps/s: {'met' if r['temporal'] >= TARGET_STEPS_S else 'NOT met'}"
        else:
            target = "-"
        print(
            f"  {r['c']:11d}{r['asyncio']:17.1f}{r['temporal']:18.1f}{r['ratio']:18.2f}{r['extra_ms']:14.2f}  {target}"
        )
    budget = os.cpu_count() * 1000 / TARGET_STEPS_S
    cpu = rows[-1]["cpu"]
    print(
        f"  {TARGET_STEPS_S:.0f} steps/s on {os.cpu_count()} CPUs leaves {budget:.1f} CPU-ms per step for every process; at "
        f"concurrency {rows[-1]['c']} the asyncio variant used {cpu['asyncio']:.1f}, the Temporal one {cpu['temporal']:.1f}"
    )
    print(json.dumps({"cpus": os.cpu_count(), "levels": rows} | host.report()))


async def amain(args, data_dir: Path) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    slots = max(args.slots, max(args.concurrency))
    async with services(data_dir, slots=slots, worker=args.worker, db_file=args.db_file) as stack:
        print(
            f"{os.cpu_count()} CPUs; worker: {args.worker}; Temporal: dev server "
            f"({'SQLite file' if args.db_file else 'in-memory SQLite'}), trajectories started {args.via}; "
            f"sandbox: 1 container x {slots} slots; pids {stack.pids}",
            flush=True,
        )
        runners = {
            "asyncio": AsyncioRunner(stack.settings, stack.pool),
            "temporal": TemporalRunner(stack.client, TASK_QUEUE, args.via),
        }
        try:
            async with contextlib.AsyncExitStack() as floor:
                if args.floor:
                    runners["floor"] = await floor.enter_async_context(FloorRunner(stack.client))
                await run_levels(stack, runners, args)
        finally:
            await runners["asyncio"].aclose()


async def run_levels(stack: Stack, runners: dict, args) -> None:
    warm_c = max(args.concurrency)
    print(
        f"warm-up: {args.warmup} trajectories x {args.warmup_steps} steps at concurrency {warm_c}, "
        f"each variant ({', '.join(runners)})",
        flush=True,
    )
    for runner in runners.values():
        await runner.run(warm_c, args.warmup, args.warmup_steps)
    counts = args.trajectories or [max(10, 2 * c) if not args.quick else max(5, c) for c in args.concurrency]
    counts = counts * len(args.concurrency) if len(counts) == 1 else counts
    rows = [await run_level(stack, runners, args, c, n) for c, n in zip(args.concurrency, counts, strict=True)]
    summary(rows, args.host)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", help="trajectories in flight (default: 1 200)")
    parser.add_argument("--steps", type=int, help="echo steps per trajectory (default 10; 4 with --quick)")
    parser.add_argument(
        "--trajectories",
        type=int,
        nargs="+",
        help="trajectories per level, one number or one per level (default max(10, 2 x concurrency))",
    )
    parser.add_argument("--repeat", type=int, default=1, help="runs per variant and level; the median is compared")
    parser.add_argument("--warmup", type=int, help="warm-up trajectories per variant (default: max concurrency)")
    parser.add_argument("--warmup-steps", type=int, default=2)
    parser.add_argument(
        "--worker",
        choices=["process", "inproc"],
        default="process",
        help="`python worker.py` in its own process, or build_worker() in this one",
    )
    parser.add_argument(
        "--via",
        choices=["direct", "batch"],
        default="direct",
        help="start TrajectoryWorkflows from this client, or as children of one BatchWorkflow",
    )
    parser.add_argument(
        "--db-file",
        action="store_true",
        help="dev server on an SQLite file (as `python worker.py` embedded runs it) instead of in-memory SQLite",
    )
    parser.add_argument("--slots", type=int, default=0, help="sandbox slots (default: max concurrency)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs, databases)")
    parser.add_argument("--quick", action="store_true", help="concurrency 1 and 200, one wave each, 4 steps")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="also run bench/floor.py's no-op workflow of the same shape: what Temporal alone costs per step",
    )
    quiet.add_argument(parser)
    args = parser.parse_args(argv)
    args.concurrency = args.concurrency or [1, 200]
    args.steps = args.steps or (4 if args.quick else 10)
    args.warmup = args.warmup if args.warmup is not None else min(max(args.concurrency), 50 if args.quick else 200)
    if args.trajectories and len(args.trajectories) not in (1, len(args.concurrency)):
        parser.error("--trajectories takes one number or one per --concurrency level")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.host = quiet.check_host(args.allow_busy)
    return run_in_data_dir("bench-orchestration-", args.keep, lambda data_dir: amain(args, data_dir))


if __name__ == "__main__":
    sys.exit(main())
