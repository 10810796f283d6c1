"""What a neighbour's `echo` costs while another slot attacks what slots share (issue 39).

Starts real sandbox servers (LocalBackend, 2 slots, bubblewrap) and, for each attack, runs it in
one slot while the other slot runs `echo` in a loop, as an agent's terminal calls would. It prints
the neighbour's `echo` round trip (p50, p99, count) during the attack, how long the attack ran,
the server's own CPU seconds meanwhile, what the attacker's slot was left with, and the load
average before and after. The attacks:

- `idle`: no attack, the baseline;
- `inode-flood`: one command makes empty files until it is refused;
- `disk-flood`: one command writes 2 GiB of zeros into its 1 GiB slot;
- `background-writer`: a job left running in the stateful terminal writes 1 MB files for 10 s;
- `memfd-hog`: a 512 MiB slot of a server without cgroups (the watchdog mode) fills six 300 MiB memfds;
- `walk-300k`: a slot of a server whose volumes are checked (walked) makes 300,000 files, past its
  file limit, then runs 20 of the agent's commands (each was a 2 CPU-s walk before issue 39);
- `sparse-snapshot`: four 1,000 MB files of 4 KB on disk, the whole workspace downloaded as tar.gz 3 times.

An attack over in less than 10 s runs again (its slot cleared first), so every figure has samples.

    python bench/sandbox_attacks.py                     # every attack
    python bench/sandbox_attacks.py --only disk-flood   # one

The last line is one JSON object with every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.sandbox_limits import holder, load
from temporal_rollouts.core.settings import SandboxSettings
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.config import ServerOptions, SlotLimits
from temporal_rollouts.sandbox_server.schema import (
    AcquireRequest,
    ExecOp,
    ExecuteRequest,
    ReleaseRequest,
    SessionOp,
    SlotLease,
    TransferQuery,
)

LIMITS = SlotLimits(disk_limit_mb=1024, file_size_limit_mb=2048, memory_limit_mb=512)
LOOP = ServerOptions(limits=LIMITS)
CHECKED = ServerOptions(limits=LIMITS, slot_volume="checked")
WATCHDOG = ServerOptions(limits=LIMITS, use_cgroups=False)
TICKS = os.sysconf("SC_CLK_TCK")

INODE_FLOOD = (
    'python3 -c \'import os\nn = 0\ntry:\n    while True:\n        open("f%d" % n, "w").close(); n += 1\n'
    'except OSError as err:\n    print("made", n, err.strerror)\''
)
DISK_FLOOD = "for i in 1 2 3 4; do head -c 512M /dev/zero > f$i; done; du -sh ."
WRITER = (
    "python3 -c 'import os, time\nend = time.time() + 10\nwhile time.time() < end:\n    try:\n"
    '        with open("bg-%d" % time.monotonic_ns(), "wb") as out: out.write(b"x" * (1 << 20))\n'
    "    except OSError: time.sleep(0.01)' > /dev/null 2>&1 & echo started"
)
MEMFD_HOG = (
    'python3 -c \'import os, time\nfds = []\nfor i in range(6):\n    fd = os.memfd_create("hog%d" % i)\n'
    '    for _ in range(300): os.write(fd, b"x" * (1 << 20))\n    fds.append(fd)\ntime.sleep(3)\nprint("survived")\''
)
MANY_FILES = (
    "mkdir many && cd many && python3 -c 'import os\nfor n in range(300_000): os.close(os.open(str(n), os.O_CREAT))'"
)
SPARSE = "for i in 1 2 3 4; do truncate -s 1000M s$i; echo data >> s$i; done; du -sh ."


def call(lease: SlotLease, operation) -> ExecuteRequest:
    return ExecuteRequest(slot=lease.slot, lease_id=lease.lease_id, call_id=uuid.uuid4().hex, operation=operation)


def server_cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def percentiles(values: list[float]) -> dict[str, float]:
    values = sorted(values) or [float("nan")]
    return {
        "p50_ms": round(statistics.median(values) * 1000, 1),
        "p99_ms": round(values[min(len(values) - 1, int(0.99 * len(values)))] * 1000, 1),
        "n": len(values),
    }


async def echo_loop(client: SandboxClient, lease: SlotLease, stop: asyncio.Event, times: list[float]) -> None:
    while not stop.is_set():
        started = time.perf_counter()
        output = await client.send(call(lease, ExecOp(command="echo hi")))
        times.append(time.perf_counter() - started)
        assert output.output == "hi\n", output.output
        await asyncio.sleep(0.05)


async def inode_flood(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    return (await client.send(call(lease, ExecOp(command=INODE_FLOOD, timeout_s=300)))).output[-300:]


async def disk_flood(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    return (await client.send(call(lease, ExecOp(command=DISK_FLOOD, timeout_s=300)))).output[-300:]


async def background_writer(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    await client.send(call(lease, SessionOp(action="run", text=WRITER, timeout_s=30)))
    await asyncio.sleep(10)
    return (await client.send(call(lease, ExecOp(command="du -sh .; ls | wc -l")))).output[-300:]


async def memfd_hog(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    return (await client.send(call(lease, ExecOp(command=MEMFD_HOG, timeout_s=60)))).output[-300:]


async def walk_300k(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    made = await client.send(call(lease, ExecOp(command=MANY_FILES, timeout_s=600)))
    started = time.perf_counter()
    for _ in range(20):  # the agent's own commands (resident, as its terminal calls are)
        await client.send(call(lease, ExecOp(command="true", resident=True)))
    return f"{made.output[-200:]} | 20 commands after: {time.perf_counter() - started:.2f} s"


async def sparse_snapshot(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    await client.send(call(lease, ExecOp(command=SPARSE)))
    taken = []
    for index in range(3):
        started = time.perf_counter()
        query = TransferQuery(slot=lease.slot, lease_id=lease.lease_id, path=".", format="tar.gz")
        size, _ = await client.download(query, tmp / f"snapshot-{index}.tar.gz")
        taken.append(f"{time.perf_counter() - started:.2f} s ({size} bytes)")
    return "snapshots: " + ", ".join(taken)


Attack = Callable[[SandboxClient, SlotLease, Path], Awaitable[str]]


async def idle(client: SandboxClient, lease: SlotLease, tmp: Path) -> str:
    await asyncio.sleep(5)
    return ""


CLEAR = "find . -mindepth 1 -delete"
ATTACKS: dict[str, tuple[ServerOptions, Attack, str | None]] = {
    "idle": (LOOP, idle, None),
    "inode-flood": (LOOP, inode_flood, CLEAR),
    "disk-flood": (LOOP, disk_flood, CLEAR),
    "background-writer": (LOOP, background_writer, None),
    "memfd-hog": (WATCHDOG, memfd_hog, "true"),
    "walk-300k": (CHECKED, walk_300k, None),
    "sparse-snapshot": (LOOP, sparse_snapshot, CLEAR),
}
"""name -> (server options, attack, the command that clears its slot before it runs again; None: run once)."""
MIN_ATTACK_S = 10.0
"""An attack that ends sooner runs again (after its clearing command), so the neighbour's figures have samples."""


async def measure(name: str, options: ServerOptions, attack: Attack, clear: str | None, tmp: Path) -> dict:
    backend = LocalBackend(tmp / name, SandboxSettings(**{**options.model_dump(), "slots_per_container": 2}))
    info = await backend.start_container()
    assert info.pid is not None
    try:
        async with SandboxClient(info.url, info.read_token(), timeout=600) as client:
            health = await client.send(HealthQuery())
            attacker = await client.send(AcquireRequest(holder=holder(), ttl_s=900, wait_s=30))
            neighbour = await client.send(AcquireRequest(holder=holder(), ttl_s=900, wait_s=30))
            for _ in range(5):  # warm the neighbour's launcher up
                await client.send(call(neighbour, ExecOp(command="echo hi")))
            before, cpu_before, times, stop = load(), server_cpu_s(info.pid), [], asyncio.Event()
            echoes = asyncio.create_task(echo_loop(client, neighbour, stop, times))
            started, rounds = time.perf_counter(), 0
            while True:
                outcome = await attack(client, attacker, tmp)
                rounds += 1
                if clear is None or time.perf_counter() - started >= MIN_ATTACK_S:
                    break
                await client.send(call(attacker, ExecOp(command=clear, timeout_s=300)))
            took = time.perf_counter() - started
            stop.set()
            await echoes
            row = {
                "attack": name,
                "neighbour_echo": percentiles(times),
                "attack_s": round(took, 1),
                "rounds": rounds,
                "server_cpu_s": round(server_cpu_s(info.pid) - cpu_before, 2),
                "load_before": before,
                "load_after": load(),
                "disk": health.limits.get("disk"),
                "memory": health.limits.get("memory"),
                "outcome": " ".join(outcome.split())[-240:],
            }
            for lease in (attacker, neighbour):
                await client.send(ReleaseRequest(slot=lease.slot, lease_id=lease.lease_id))
            return row
    finally:
        await backend.stop_container(info.container_id)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", choices=sorted(ATTACKS), action="append")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-attacks-") as tmp:
        for name in args.only or list(ATTACKS):
            options, attack, clear = ATTACKS[name]
            row = await measure(name, options, attack, clear, Path(tmp))
            echo = row["neighbour_echo"]
            print(
                f"{name:18} neighbour echo p50 {echo['p50_ms']:7.1f} ms  p99 {echo['p99_ms']:7.1f} ms  (n={echo['n']:4})"
                f"  attack {row['attack_s']:6.1f} s ({row['rounds']}x)  server CPU {row['server_cpu_s']:6.2f} s"
                f"  load {row['load_before']} -> {row['load_after']}",
                flush=True,
            )
            print(f"{'':18} {row['outcome']}", flush=True)
            rows.append(row)
    print(json.dumps(rows))


if __name__ == "__main__":
    asyncio.run(main())
