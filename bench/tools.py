"""The stateful terminal's round trip against one-shot commands, and file transfer throughput.

Runs against a real sandbox server process (LocalBackend, under bubblewrap when the host has
it), through the same SandboxPool the activities use; no Temporal. A one-shot command in a
sandbox of its own pays for a new sandbox each time (setup and verify hooks run so); a resident
one-shot command (an agent's `terminal` call) is forked from the slot's resident launcher
(`sandbox_server.isolation.launcher`); a stateful call types into a shell that is already running.
The resident calls run again in a workspace the size of an SWE checkout (`--tree-files` small files in
folders of 100), where the server's walk of the workspace after a command (`sandbox_server.volumes.disk_watch`)
would otherwise dominate, and the agent's `search` (grep from the same launcher) over a folder of 100
of those files. Transfers stream a file of random bytes up and back (byte-identical, checked) and report MB/s
each way and the server's peak RSS growth while they ran. Each kind of call also reports the
CPU it cost the sandbox server: with its sandboxes (bubblewrap, the launcher, bash), and in the
server process alone. Last, short leases of one call each show what a lease's launcher costs.

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
from temporal_rollouts.core.settings import PoolOptions, SandboxSettings
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.isolation.bubblewrap import bubblewrap_path  # noqa: E402
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, SearchOp, SessionOp  # noqa: E402


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


LEASE_SETTLE_S = 1.0


def own_cpu_seconds(pid: int) -> float:
    """User + system CPU of the process alone, without its sandboxes."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def round_trips(
    pool: SandboxPool, lease, rounds: int, make, server_pid: int, expect: str = "ping\n"
) -> dict[str, float]:
    """Each call's wall time, and the server's CPU-ms per call over all of them: with its sandboxes
    (bubblewrap, the resident launcher, bash) and alone."""
    await pool.lease(lease).execute(uuid.uuid4().hex, make())  # a resident launcher starts on the first call
    times = []
    cpu_before, own_before = cpu_seconds(server_pid), own_cpu_seconds(server_pid)
    for _ in range(rounds):
        started = time.perf_counter()
        output = await pool.lease(lease).execute(uuid.uuid4().hex, make())
        times.append(time.perf_counter() - started)
        assert output.ok and output.output == expect, output
    ordered = sorted(times)
    return {
        "median_ms": round(statistics.median(ordered) * 1000, 2),
        "p95_ms": round(ordered[int(0.95 * (len(ordered) - 1))] * 1000, 2),
        "server_cpu_ms": round((cpu_seconds(server_pid) - cpu_before) * 1000 / rounds, 2),
        "server_process_cpu_ms": round((own_cpu_seconds(server_pid) - own_before) * 1000 / rounds, 2),
    }


async def short_leases(pool: SandboxPool, leases: int, resident: bool, server_pid: int) -> float:
    """The server's CPU-ms (with its sandboxes) for a lease of one `echo`: acquire, the call, release
    and the slot's reset. A resident call's lease also starts and stops the slot's launcher."""
    cpu_before = cpu_seconds(server_pid)
    for _ in range(leases):
        lease = await pool.acquire(Holder(workflow_id="bench-tools-lease"), ttl_s=600, wait_s=10)
        output = await pool.lease(lease).execute(uuid.uuid4().hex, ExecOp(command="echo ping", resident=resident))
        assert output.ok, output
        await pool.release(lease)
    await asyncio.sleep(LEASE_SETTLE_S)  # the last reset runs after the release returns
    return round((cpu_seconds(server_pid) - cpu_before) * 1000 / leases, 1)


def checkout_like(folder: Path, files: int) -> Path:
    """A folder of `files` small source files, 100 to a subfolder, as an SWE checkout has thousands."""
    for index in range(files):
        path = folder / f"pkg{index // 100}" / f"module{index % 100}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"VALUE = {index}\n" * 20)
    return folder


async def main(rounds: int, megabytes: int, tree_files: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="bench-tools-") as scratch:
        root = Path(scratch)
        backend = LocalBackend(root / "data", SandboxSettings(slots_per_container=1))
        async with SandboxPool(backend, PoolOptions(max_containers=1)) as pool:
            (info,) = await pool.fleet.ensure_running()
            try:
                lease = await pool.acquire(Holder(workflow_id="bench-tools"), ttl_s=600, wait_s=10)
                await pool.lease(lease).execute("warm", SessionOp(action="start"))
                one_shot = await round_trips(pool, lease, rounds, lambda: ExecOp(command="echo ping"), info.pid)
                resident = await round_trips(
                    pool, lease, rounds, lambda: ExecOp(command="echo ping", resident=True), info.pid
                )
                stateful = await round_trips(
                    pool, lease, rounds, lambda: SessionOp(action="run", text="echo ping"), info.pid
                )
                await pool.lease(lease).upload(checkout_like(root / "tree", tree_files), "tree")
                in_tree = await round_trips(
                    pool, lease, rounds, lambda: ExecOp(command="echo ping", resident=True), info.pid
                )
                search = await round_trips(  # one folder of 100 files: the call's cost more than grep's
                    pool,
                    lease,
                    rounds,
                    lambda: SearchOp(pattern="VALUE = 7$", path="tree/pkg0", resident=True),
                    info.pid,
                    "\n".join(f"tree/pkg0/module7.py:{line}:VALUE = 7" for line in range(1, 21)),
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
                await short_leases(pool, 2, True, info.pid)  # warm
                leases = max(10, rounds // 5)
                lease_own = await short_leases(pool, leases, False, info.pid)
                lease_resident = await short_leases(pool, leases, True, info.pid)
            finally:
                await backend.stop_container(info.container_id)
    return {
        "isolation": "bubblewrap" if bubblewrap_path() else "none",
        "rounds": rounds,
        "one_shot": one_shot,
        "one_shot_resident": resident,
        "stateful": stateful,
        "tree_files": tree_files,
        "one_shot_resident_in_tree": in_tree,
        "search": search,
        "stateful_speedup": round(one_shot["median_ms"] / stateful["median_ms"], 2),
        "lease_of_one_call_cpu_ms": {"own_sandbox": lease_own, "resident": lease_resident},
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
    parser.add_argument("--tree-files", type=int, default=3000, help="files in the checkout-sized workspace")
    quiet.add_argument(parser)
    args = parser.parse_args()
    host = quiet.check_host(args.allow_busy)
    figures = asyncio.run(main(args.rounds or (10 if args.quick else 30), 16 if args.quick else 64, args.tree_files))
    for name, kind in (
        ("one-shot, own sandbox", "one_shot"),
        ("one-shot, resident", "one_shot_resident"),
        ("stateful terminal", "stateful"),
        (f"resident, {figures['tree_files']} files", "one_shot_resident_in_tree"),
        ("search, 100 files", "search"),
    ):
        row = figures[kind]
        print(
            f"{name:22} median {row['median_ms']:7.1f} ms   p95 {row['p95_ms']:7.1f} ms   server CPU "
            f"{row['server_cpu_ms']:5.2f} ms a call ({row['server_process_cpu_ms']:5.2f} in the server process)"
        )
    lease = figures["lease_of_one_call_cpu_ms"]
    print(
        f"a lease of one echo (acquire, call, release, reset): {lease['own_sandbox']} CPU-ms in a sandbox of its "
        f"own, {lease['resident']} resident (the launcher's start and stop included)"
    )
    print(
        f"upload {figures['upload_mb_s']} MB/s, download {figures['download_mb_s']} MB/s "
        f"({figures['transfer_mb']} MB, identical={figures['byte_identical']}, "
        f"server peak RSS +{figures['server_peak_rss_growth_mb']} MB)"
    )
    print(json.dumps(figures | host.report()))
