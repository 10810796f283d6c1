"""Worker variants side by side: their CPU per rollout step, measured in the same minutes.

    python bench/worker_ab.py new base:tree=/tmp/base              # this checkout against another
    python bench/worker_ab.py default fixed:WORKER__SLOT_SUPPLIER=fixed
    python bench/worker_ab.py a a2 b:tree=../old b2:tree=../old --per 50 --rounds 3

Each variant is a `python worker.py` process of its own, on its own task queue, with its own
settings (ROLLOUTS_* names without the prefix) or from another checkout of this repository
(`tree=PATH`, e.g. a `git worktree` of an older commit). All of them run `echo_chain` rollouts
at the same time, `--per` at once each, against one dev server, one demo policy and one sandbox
server. This VM's speed moves by up to 2x within minutes (bench/README.md, "The machine"), so
two runs taken one after the other cannot show a change of a few per cent; variants that run
at the same time share whatever the machine does. Name a variant twice (`a a2`) to see the
method's own spread: the two copies of one variant agree to within 1 % on this VM.

Per round it prints each variant's worker CPU-ms per step (user + system, over the round) and
the dev server's over all of them, then each variant's mean and its difference from the first
variant in every round.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from bench.procs import busy_share, cpu_seconds, free_port, host_cpu, run_in_data_dir, services, worker_process  # noqa: E402
from bench.quiet import HostBefore  # noqa: E402
from bench.runs import TemporalRunner  # noqa: E402


@dataclass(frozen=True)
class Variant:
    label: str
    env: dict[str, str]
    tree: Path | None = None


def parse_variant(spec: str) -> Variant:
    """`LABEL` or `LABEL:NAME=VALUE,...`, NAME a setting's ROLLOUTS_ name without the prefix or `tree`."""
    label, _, rest = spec.partition(":")
    if not label:
        raise argparse.ArgumentTypeError(f"{spec!r}: a variant needs a label")
    env, tree = {}, None
    for assignment in filter(None, rest.split(",")):
        name, eq, value = assignment.partition("=")
        if not eq:
            raise argparse.ArgumentTypeError(f"{assignment!r} in {spec!r} is not NAME=VALUE")
        if name == "tree":
            tree = Path(value).resolve()
            if not (tree / "worker.py").is_file():
                raise argparse.ArgumentTypeError(f"{tree} holds no worker.py")
        else:
            env["ROLLOUTS_" + name] = value
    return Variant(label, env, tree)


async def amain(args, data_dir: Path, host: HostBefore) -> dict:
    variants: list[Variant] = args.variants
    async with services(data_dir, slots=args.per * len(variants), worker="none", db_file=False) as stack:
        async with contextlib.AsyncExitStack() as workers:
            pids, runners = {}, {}
            for variant in variants:
                queue = f"bench-{variant.label}"
                env = {
                    "ROLLOUTS_TEMPORAL__TASK_QUEUE": queue,
                    "ROLLOUTS_WORKER__METRICS_ADDRESS": f"127.0.0.1:{free_port()}",
                    **variant.env,
                }
                log_path = data_dir / f"worker-{variant.label}.log"
                pids[variant.label] = await worker_process(workers, stack.settings, log_path, env, variant.tree)
                runners[variant.label] = TemporalRunner(stack.client, queue, "direct")
            print(
                f"{len(variants)} workers, {args.per} rollouts at once each, {args.trajectories} rollouts of "
                f"{args.steps} echo steps per round; pids {pids}",
                flush=True,
            )
            await asyncio.gather(*(runner.run(args.per, args.per, 2) for runner in runners.values()))  # warm-up

            rounds: dict[str, list[float]] = {label: [] for label in pids}
            server_rounds = []
            for number in range(1, args.rounds + 1):
                before = {label: cpu_seconds(pid) for label, pid in pids.items()}
                server_before, host_before, started = (
                    cpu_seconds(stack.pids["temporal"]),
                    host_cpu(),
                    time.perf_counter(),
                )
                tallies = await asyncio.gather(
                    *(runner.run(args.per, args.trajectories, args.steps) for runner in runners.values())
                )
                wall, host_after = time.perf_counter() - started, host_cpu()
                steps = dict(zip(runners, (tally.steps for tally in tallies), strict=True))
                for label, pid in pids.items():
                    rounds[label].append((cpu_seconds(pid) - before[label]) * 1000 / steps[label])
                server_rounds.append((cpu_seconds(stack.pids["temporal"]) - server_before) * 1000 / sum(steps.values()))
                busy = busy_share(host_before, host_after)
                print(
                    f"round {number}: {wall:.1f} s, host {100 * busy:.0f}% busy, dev server {server_rounds[-1]:.2f} "
                    "| worker CPU-ms per step: " + "  ".join(f"{label} {rounds[label][-1]:.2f}" for label in rounds),
                    flush=True,
                )
    first = variants[0].label
    print("variant    mean CPU-ms/step   minus " + first + ", per round")
    for label, values in rounds.items():
        deltas = [value - base for value, base in zip(values, rounds[first], strict=True)]
        print(f"{label:10s} {statistics.mean(values):10.2f}   " + "  ".join(f"{d:+.2f}" for d in deltas))
    return {
        "per": args.per,
        "steps": args.steps,
        "trajectories": args.trajectories,
        "worker_cpu_ms_per_step": {label: [round(v, 3) for v in values] for label, values in rounds.items()},
        "server_cpu_ms_per_step": [round(v, 3) for v in server_rounds],
    } | host.report()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("variants", nargs="+", type=parse_variant, help="LABEL[:NAME=VALUE,...] (see above)")
    parser.add_argument("--per", type=int, default=60, help="rollouts at once on each worker")
    parser.add_argument("--trajectories", type=int, default=120, help="rollouts per worker per round")
    parser.add_argument("--steps", type=int, default=12, help="echo steps per rollout (2 x steps + 1 counted)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs, databases)")
    quiet.add_argument(parser)
    args = parser.parse_args(argv)
    labels = [variant.label for variant in args.variants]
    if len(set(labels)) != len(labels):
        parser.error(f"variant labels must differ: {labels}")
    host = quiet.check_host(args.allow_busy)

    async def measured(data_dir: Path) -> None:
        print(json.dumps(await amain(args, data_dir, host)))

    return run_in_data_dir("bench-worker-ab-", args.keep, measured)


if __name__ == "__main__":
    sys.exit(main())
