"""The stateful terminal's round trip against a one-shot command, and file transfer throughput.

Runs against a real sandbox server process (LocalBackend, under bubblewrap when the host has
it), through the same SandboxPool the activities use; no Temporal. A one-shot command pays
for a new sandbox each time; a stateful call types into a shell that is already running.
Transfers stream a file of random bytes up and back (byte-identical, checked) and report
MB/s each way and the server's peak RSS growth while they ran. Each kind of call also reports
the CPU it cost the sandbox server: its own and its reaped children's (bubblewrap, bash).

    python bench/tools.py            # 30 round trips each, a 64 MB file
    python bench/tools.py --quick    # 10 round trips, 16 MB
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from bench.procs import cpu_seconds  # noqa: E402
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.isolation import bubblewrap_path  # noqa: E402
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, SessionOp  # noqa: E402


def peak_rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def digest(path: Path) -> str:
    sha = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


async def round_trips(pool: SandboxPool, lease, rounds: int, make, server_pid: int) -> tuple[list[float], float]:
    """Each call's wall time, and the server's CPU-ms per call over all of them."""
    times = []
    cpu_before = cpu_seconds(server_pid)
    for _ in range(rounds):
        started = time.perf_counter()
        output = await pool.lease(lease).execute(uuid.uuid4().hex, make())
        times.append(time.perf_counter() - started)
        assert output.ok and output.output == "ping\n", output
    return times, (cpu_seconds(server_pid) - cpu_before) * 1000 / rounds


def summary(values: list[float], server_cpu_ms: float) -> dict[str, float]:
    ordered = sorted(values)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
        "server_cpu_ms": round(server_cpu_ms, 2),
    }


async def main(rounds: int, megabytes: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        root = Path(scratch)
        backend = LocalBackend(root / "data", slots_per_container=1)
        async with SandboxPool(backend) as pool:
            (info,) = await pool.fleet.ensure_running()
            try:
                lease = await pool.acquire(Holder(workflow_id="bench-tools"), ttl_s=600, wait_s=10)
                await pool.lease(lease).execute("warm", SessionOp(action="start"))
                one_shot = await round_trips(pool, lease, rounds, lambda: ExecOp(command="echo ping"), info.pid)
                stateful = await round_trips(
                    pool, lease, rounds, lambda: SessionOp(action="run", text="echo ping"), info.pid
                )

                source = root / "payload.bin"
                with open(source, "wb") as out:
                    for _ in range(megabytes):
                        out.write(os.urandom(1 << 20))
                rss_before = peak_rss(info.pid)
                started = time.perf_counter()
                await pool.lease(lease).upload(source, "payload.bin")
                up_s = time.perf_counter() - started
                back = root / "back.bin"
                started = time.perf_counter()
                await pool.lease(lease).download("payload.bin", back)
                down_s = time.perf_counter() - started
                identical = digest(source) == digest(back)
                rss_growth = peak_rss(info.pid) - rss_before
                await pool.release(lease)
            finally:
                await backend.stop_container(info.container_id)
    one, state = summary(*one_shot), summary(*stateful)
    return {
        "isolation": "bubblewrap" if bubblewrap_path() else "none",
        "rounds": rounds,
        "one_shot": one,
        "stateful": state,
        "stateful_speedup": round(one["median_ms"] / state["median_ms"], 2),
        "transfer_mb": megabytes,
        "upload_mb_s": round(megabytes / up_s, 1),
        "download_mb_s": round(megabytes / down_s, 1),
        "byte_identical": identical,
        "server_peak_rss_growth_mb": round(rss_growth / 2**20, 1),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rounds", type=int, help="calls of each kind (default 30; 10 with --quick)")
    quiet.add_argument(parser)
    args = parser.parse_args()
    host = quiet.check_host(args.allow_busy)
    figures = asyncio.run(main(args.rounds or (10 if args.quick else 30), 16 if args.quick else 64))
    one, state = figures["one_shot"], figures["stateful"]
    for name, row in (("one-shot command ", one), ("stateful terminal", state)):
        print(
            f"{name}  median {row['median_ms']:7.1f} ms   p95 {row['p95_ms']:7.1f} ms   "
            f"server CPU {row['server_cpu_ms']:5.2f} ms a call"
        )
    print(
        f"upload {figures['upload_mb_s']} MB/s, download {figures['download_mb_s']} MB/s "
        f"({figures['transfer_mb']} MB, identical={figures['byte_identical']}, "
        f"server peak RSS +{figures['server_peak_rss_growth_mb']} MB)"
    )
    print(json.dumps(figures | host.report()))
