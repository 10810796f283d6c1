"""Batch throughput on two worker hosts against one host, in one run, against the same services.

"Hosts" are set up as tests/integration/test_two_hosts.py sets them up, on this one machine: each host
is a `python worker.py` process with its own data dir and `worker.host_name`, beside a sandbox server
on its own loopback address (127.0.0.2, 127.0.0.3), both servers shared by the hosts' workers through
the `static` backend (tokens derived from one pool secret). All layouts share one Temporal dev server,
one demo policy (answering every turn after `--delay` seconds) and S3 (moto_server) for payloads.
The process helpers are imported from tests.support (WorkerProcess, SandboxProcess,
DemoPolicyProcess, LoopbackServer) and bench.procs (the dev server, CPU accounting, cleanup).

Each layout runs the same BatchWorkflow of `echo_chain` rollouts (after a short warm-up batch), on
its own task queue, with fresh workers and sandbox servers:

- `one`: one host with `--slots` slots;
- `two-same-per-host`: two hosts with `--slots` slots each (twice the slots in all);
- `two-same-total`: two hosts with `--slots`/2 slots each (the same slots in all).

On one machine the two "hosts" share the same cores, so the ratio two/one shows what coordinating
across hosts costs (no CPU gain is to be expected), not what a real second machine gains. With a
per-turn model delay, throughput is bounded by concurrency / latency: two hosts with twice the
slots show the gain when the slots, not the CPU, bind.

The last line of output is one JSON object with the headline figures.

    python bench/two_hosts.py                        # 40 items, 4 steps, delay 0.5 s, concurrency 16, 8 slots/host
    python bench/two_hosts.py --items 80 --steps 6 --concurrency 32 --slots 16
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.procs import cpu_seconds, host_cpu, run_in_data_dir, temporal_dev_server  # noqa: E402
from temporal_rollouts.core.records import BatchInput, BatchResult, RolloutLimits  # noqa: E402
from temporal_rollouts.core.settings import Settings  # noqa: E402
from temporal_rollouts.runtime.temporal import connect  # noqa: E402
from temporal_rollouts.sandbox.backends.tokens import derive_token  # noqa: E402
from tests.support.processes import WorkerProcess  # noqa: E402
from tests.support.sandbox import executions_under  # noqa: E402
from tests.support.sandbox_process import SandboxProcess  # noqa: E402
from tests.support.servers.demo_policy import DemoPolicyProcess  # noqa: E402
from tests.support.servers.process import HOST, LoopbackServer  # noqa: E402
from workflows.batch import BatchWorkflow  # noqa: E402

SECRET_ENV = "BENCH_POOL_SECRET"
BUCKET = "rollouts-bench-two-hosts"
ADDRESSES = {"host-a": "127.0.0.2", "host-b": "127.0.0.3"}
ROLES = ("worker", "sandbox", "temporal", "policy", "s3", "bench")


@dataclass
class Shared:
    """What every layout runs against."""

    data_dir: Path
    temporal_address: str
    policy: DemoPolicyProcess
    s3_url: str
    pids: dict[str, int]  # temporal, policy, s3


@dataclass
class Layout:
    key: str
    label: str
    hosts: int
    slots_per_host: int

    @property
    def slots(self) -> int:
        return self.hosts * self.slots_per_host


def host_settings(shared: Shared, row_dir: Path, host: str, queue: str, servers: list[SandboxProcess]) -> Settings:
    return Settings(
        data_dir=row_dir / host / "data",
        temporal={"address": shared.temporal_address, "task_queue": queue},
        demo_policy={"port": shared.policy.port, "start_local": False},
        worker={"host_name": host, "graceful_shutdown_s": 2.0},
        storage={"type": "s3", "endpoint_url": shared.s3_url, "region": "us-east-1", "bucket": BUCKET},
        sandbox={
            "backend": {
                "type": "static",
                "servers": [{"container_id": s.container_id, "url": s.url} for s in servers],
                "secret_env": SECRET_ENV,
            },
            "slots_per_container": max(s.slots for s in servers),
            "min_containers": 0,
            "max_containers": len(servers),
            "acquire_timeout_s": 600,
        },
    )


async def run_batch(client, queue: str, items: int, steps: int, concurrency: int, batch_id: str) -> float:
    limits = RolloutLimits(max_turns=steps + 1, max_tool_calls=max(steps, 1))
    batch = BatchInput(
        env="echo_chain",
        num_items=items,
        group_size=1,
        max_concurrency=concurrency,
        env_config={"steps": steps},
        limits=limits,
    )
    started = time.perf_counter()
    result = BatchResult.model_validate(
        await client.execute_workflow(BatchWorkflow.run, batch, id=batch_id, task_queue=queue)
    )
    wall = time.perf_counter() - started
    if (result.completed, result.failed, result.mean_score) != (items, 0, 1.0):
        raise RuntimeError(f"batch {batch_id} did not complete cleanly: {result}")
    return wall


async def run_layout(shared: Shared, layout: Layout, args: argparse.Namespace) -> dict:
    row_dir = shared.data_dir / layout.key
    hosts = list(ADDRESSES)[: layout.hosts]
    servers = [
        SandboxProcess(
            row_dir / host / "sandbox",
            f"sandbox-{layout.key}-{host}",
            derive_token(os.environ[SECRET_ENV], f"sandbox-{layout.key}-{host}"),
            host=ADDRESSES[host],
            slots=layout.slots_per_host,
        )
        for host in hosts
    ]
    workers: list[WorkerProcess] = []
    queue = f"two-hosts-{layout.key}-{uuid.uuid4().hex[:6]}"
    try:
        for server in servers:
            await asyncio.to_thread(server.start)
        for host in hosts:
            settings = host_settings(shared, row_dir, host, queue, servers)
            settings.data_dir.mkdir(parents=True)
            workers.append(WorkerProcess(settings, row_dir / host / "worker.log"))
            workers[-1].start()
        for worker in workers:
            await asyncio.to_thread(worker.wait_ready, 120)
        client = await connect(workers[0].settings, start_embedded=False)
        # Warm-up: imports, connections, the workflow cache on every worker; one short rollout per slot.
        await run_batch(client, queue, layout.slots, 1, layout.slots, f"warmup-{queue}")

        pids = {f"worker/{h}": w.proc.pid for h, w in zip(hosts, workers, strict=True)}
        pids |= {f"sandbox/{h}": s.proc.pid for h, s in zip(hosts, servers, strict=True)}
        pids |= shared.pids | {"bench": os.getpid()}
        before, busy_before = {role: cpu_seconds(pid) for role, pid in pids.items()}, host_cpu()
        batch_id = f"bench-{queue}"
        wall = await run_batch(client, queue, args.items, args.steps, args.concurrency, batch_id)
        after, busy_after = {role: cpu_seconds(pid) for role, pid in pids.items()}, host_cpu()
        used = {role: after[role] - before[role] for role in pids}
        tool_calls = {
            h: sum("/turn-" in e["call_id"] for e in executions_under(s.root, f"{batch_id}/"))
            for h, s in zip(hosts, servers, strict=True)
        }
    finally:
        await asyncio.gather(*(asyncio.to_thread(w.stop) for w in workers))
        for server in servers:
            server.stop()
    steps = args.items * (2 * args.steps + 1)
    cpu = {role: sum(v for name, v in used.items() if name.split("/")[0] == role) for role in ROLES}
    busy, total = busy_after[0] - busy_before[0], busy_after[1] - busy_before[1]
    return {
        "label": layout.label,
        "hosts": layout.hosts,
        "slots_per_host": layout.slots_per_host,
        "slots": layout.slots,
        "wall_s": wall,
        "rollouts_s": args.items / wall,
        "steps_s": steps / wall,
        "cpu_s": cpu,
        "cpu_s_by_process": used,
        "tool_calls_by_host": tool_calls,
        "host_busy": busy / total if total else 0.0,
    }


@contextlib.asynccontextmanager
async def shared_services(data_dir: Path, delay_s: float):
    moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "test")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "test")
    async with contextlib.AsyncExitStack() as stack:
        s3 = LoopbackServer(data_dir / "moto_server.log")
        s3.what = "moto_server"
        s3.launch([moto, "-H", HOST, "-p", str(s3.port)])
        stack.callback(s3.stop)
        policy = DemoPolicyProcess(data_dir / "demo_policy.log")
        stack.callback(policy.stop)
        policy.start()
        await asyncio.to_thread(s3.wait_ready)
        policy.control(delay_s=delay_s)
        env, temporal_pid = await stack.enter_async_context(temporal_dev_server(data_dir))
        import aioboto3

        async with aioboto3.Session().client("s3", endpoint_url=s3.url, region_name="us-east-1") as admin:
            await admin.create_bucket(Bucket=BUCKET)
        pids = {"temporal": temporal_pid, "policy": policy.proc.pid, "s3": s3.proc.pid}
        yield Shared(data_dir, env.client.service_client.config.target_host, policy, s3.url, pids)


def layouts(slots: int) -> list[Layout]:
    half = max(1, slots // 2)
    return [
        Layout("one", f"1 host x {slots} slots", 1, slots),
        Layout("two-same-per-host", f"2 hosts x {slots} slots", 2, slots),
        Layout("two-same-total", f"2 hosts x {half} slots", 2, half),
    ]


def report(args: argparse.Namespace, load_before: tuple[float, ...], rows: dict[str, dict]) -> None:
    print()
    print(
        f"{'layout':22} {'slots':>5} {'wall s':>7} {'rollouts/s':>10} {'steps/s':>8}   CPU s: "
        + " ".join(f"{role:>8}" for role in ROLES)
        + f" {'total':>7}   {'ours':>5} {'host':>5}"
    )
    for row in rows.values():
        cpu = row["cpu_s"]
        print(
            f"{row['label']:22} {row['slots']:5d} {row['wall_s']:7.1f} {row['rollouts_s']:10.2f} {row['steps_s']:8.1f}"
            f"          " + " ".join(f"{cpu[role]:8.1f}" for role in ROLES) + f" {sum(cpu.values()):7.1f}"
            f"   {sum(cpu.values()) / row['wall_s'] / os.cpu_count():5.0%} {row['host_busy']:5.0%}"
        )
    for row in rows.values():
        if row["hosts"] > 1:
            by_host = ", ".join(
                f"{h}: worker {row['cpu_s_by_process'][f'worker/{h}']:.1f} CPU s, "
                f"{row['tool_calls_by_host'][h]} tool calls on its sandbox"
                for h in row["tool_calls_by_host"]
            )
            print(f"  {row['label']}: {by_host}")
    one = rows["one"]
    ratios = {key: rows[key]["steps_s"] / one["steps_s"] for key in rows if key != "one"}
    for key, ratio in ratios.items():
        print(
            f"two/one ({rows[key]['label']} vs {one['label']}): steps/s x{ratio:.2f}, "
            f"wall x{rows[key]['wall_s'] / one['wall_s']:.2f}"
        )
    bound = args.concurrency / (args.steps + 1) / args.delay if args.delay else float("nan")
    print(
        f"  bound from the model delay alone: {bound:.2f} rollouts/s at concurrency {args.concurrency} "
        f"({args.steps + 1} turns x {args.delay} s each, when the slots do not bind)"
    )
    print(
        "  ours: these processes' CPU as a share of all cores; host: how busy the machine was, whoever used it "
        "(well above ours: other jobs competed)"
    )
    print(
        '  caveat: both "hosts" share this machine\'s cores: the ratio shows the cost of coordinating across hosts, '
        "not the gain of a real second machine; with a model delay, twice the slots gain only where slots bind."
    )
    headline = {
        "bench": "two_hosts",
        "cpus": os.cpu_count(),
        "load_before": [round(v, 2) for v in load_before],
        "items": args.items,
        "steps": args.steps,
        "delay_s": args.delay,
        "concurrency": args.concurrency,
        "layouts": {
            key: {
                "hosts": r["hosts"],
                "slots": r["slots"],
                "wall_s": round(r["wall_s"], 2),
                "rollouts_s": round(r["rollouts_s"], 3),
                "steps_s": round(r["steps_s"], 2),
                "cpu_s_total": round(sum(r["cpu_s"].values()), 1),
            }
            for key, r in rows.items()
        },
        "ratio_steps_s_two_over_one": {key: round(v, 3) for key, v in ratios.items()},
    }
    print(json.dumps(headline))


async def amain(args: argparse.Namespace, data_dir: Path) -> None:
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, asyncio.current_task().cancel)
    os.environ.setdefault(SECRET_ENV, uuid.uuid4().hex + uuid.uuid4().hex)
    load_before = os.getloadavg()
    print(
        f"{os.cpu_count()} CPUs, load average before {load_before[0]:.2f} {load_before[1]:.2f} {load_before[2]:.2f}; "
        f"{args.items} echo_chain items x {args.steps} steps ({2 * args.steps + 1} steps each: turns + tool calls), "
        f"policy delay {args.delay} s per turn, batch max_concurrency {args.concurrency}",
        flush=True,
    )
    rows = {}
    async with shared_services(data_dir, args.delay) as shared:
        for layout in layouts(args.slots):
            print(f"running {layout.label} ...", flush=True)
            rows[layout.key] = await run_layout(shared, layout, args)
    report(args, load_before, rows)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=40, help="echo_chain rollouts per batch")
    parser.add_argument("--steps", type=int, default=4, help="echo steps per rollout")
    parser.add_argument("--delay", type=float, default=0.5, help="seconds the demo policy waits before each turn")
    parser.add_argument("--concurrency", type=int, default=16, help="max_concurrency of the BatchWorkflow")
    parser.add_argument("--slots", type=int, default=8, help="sandbox slots per host (halved in two-same-total)")
    parser.add_argument("--keep", action="store_true", help="keep the data directory (logs, databases)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return run_in_data_dir("bench-two-hosts-", args.keep, lambda data_dir: amain(args, data_dir))


if __name__ == "__main__":
    sys.exit(main())
