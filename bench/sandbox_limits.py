"""What slot confinement costs: a server's start, the round trip of `true`, and a slot's reset.

Starts real sandbox servers (LocalBackend, 8 slots each) three ways: the default limits of
`SandboxSettings` with each slot's files on a filesystem of its own (`slot_volume = "loop"`), the
same limits with the files checked by walking them (`"checked"`), and every limit off. For each:

- start: `start_container` to ready, which makes the 8 slots' volumes (a loop volume: a sparse image,
  mkfs.ext4 and a mount, each);
- `true` round trip: client `execute` of `ExecOp("true")`, request to reply (with a loop volume the
  check after it is one statfs; a checked volume is walked, paced by its cost);
- reset of a slot holding 10,000 files: the release call (it returns once the slot is reset: a new
  filesystem, or the workspace moved aside and a fresh one made), then the time until the old tree
  is deleted in the background (checked volumes only).

    python bench/sandbox_limits.py             # 40 rounds of `true` per server
    python bench/sandbox_limits.py --rounds 10

The load average is printed before and after; the last line is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporal_rollouts.core.settings import SandboxSettings, Settings
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.config import ServerOptions, SlotLimits
from temporal_rollouts.sandbox_server.schema import (
    AcquireRequest,
    ExecOp,
    ExecuteRequest,
    Holder,
    ReleaseRequest,
    SlotLease,
)

LIMITS_OFF = ServerOptions(limits=SlotLimits.off(), slot_volume="checked")
FILES = 10_000
SLOTS = 8


def holder() -> Holder:
    return Holder(workflow_id=f"bench-{uuid.uuid4().hex[:8]}", run_id="r")


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "median_ms": round(statistics.median(values) * 1000, 2),
        "p95_ms": round(values[int(0.95 * (len(values) - 1))] * 1000, 2),
        "n": len(values),
    }


def run_in(lease: SlotLease, call_id: str, operation: ExecOp) -> ExecuteRequest:
    return ExecuteRequest(slot=lease.slot, lease_id=lease.lease_id, call_id=call_id, operation=operation)


async def true_round_trips(client: SandboxClient, rounds: int) -> list[float]:
    lease = await client.send(AcquireRequest(holder=holder(), ttl_s=600, wait_s=30))
    times = []
    try:
        for index in range(rounds + 3):
            started = time.perf_counter()
            output = await client.send(run_in(lease, uuid.uuid4().hex, ExecOp(command="true")))
            elapsed = time.perf_counter() - started
            assert output.ok, output.output
            if index >= 3:  # the first calls warm caches up
                times.append(elapsed)
    finally:
        await client.send(ReleaseRequest(slot=lease.slot, lease_id=lease.lease_id))
    return times


async def reset_of_many_files(client: SandboxClient, slot_dir: Path) -> tuple[float, float]:
    lease = await client.send(AcquireRequest(holder=holder(), ttl_s=600, wait_s=30))
    fill = ExecOp(command=f"mkdir -p many && cd many && seq {FILES} | xargs touch && ls | wc -l", timeout_s=300)
    made = await client.send(run_in(lease, "fill", fill))
    assert made.ok and made.output.strip() == str(FILES), made.output
    started = time.perf_counter()
    await client.send(ReleaseRequest(slot=lease.slot, lease_id=lease.lease_id))
    reset = time.perf_counter() - started
    while any(path.name.startswith("trash-") for folder in (slot_dir, slot_dir / "volume") for path in listed(folder)):
        await asyncio.sleep(0.01)
    deleted = time.perf_counter() - started
    again = await client.send(AcquireRequest(holder=holder(), ttl_s=600, wait_s=30))
    listing = await client.send(run_in(again, "ls", ExecOp(command="ls -A | wc -l")))
    assert listing.output.strip() == "0", listing.output
    await client.send(ReleaseRequest(slot=again.slot, lease_id=again.lease_id))
    return reset, deleted


def listed(folder: Path) -> list[Path]:
    return list(folder.iterdir()) if folder.is_dir() else []


def load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


async def measure(name: str, options: ServerOptions, folder: Path, rounds: int) -> dict:
    backend = LocalBackend(folder, SandboxSettings(**{**options.model_dump(), "slots_per_container": SLOTS}))
    started = time.perf_counter()
    info = await backend.start_container()
    start_s = time.perf_counter() - started
    try:
        async with SandboxClient(info.url, info.read_token(), timeout=60) as client:
            health = await client.send(HealthQuery())
            rtt = summary(await true_round_trips(client, rounds))
            slot_dir = backend.container_dir(info.container_id) / "root" / "slot-0"
            reset, deleted = await reset_of_many_files(client, slot_dir)
    finally:
        await backend.stop_container(info.container_id)
    row = {
        "server": name,
        "start_ms": round(start_s * 1000, 1),
        "true_median_ms": rtt["median_ms"],
        "true_p95_ms": rtt["p95_ms"],
        "reset_10k_files_ms": round(reset * 1000, 1),
        "trash_deleted_ms": round(deleted * 1000, 1),
        "disk": health.limits.get("disk", "off"),
    }
    print(
        f"{name:28} start {row['start_ms']:7.1f} ms  `true` median {rtt['median_ms']:6.1f} ms p95 {rtt['p95_ms']:6.1f} ms"
        f"  reset of {FILES} files {row['reset_10k_files_ms']:6.1f} ms (old tree gone after {row['trash_deleted_ms']:.1f} ms)",
        flush=True,
    )
    return row


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    limits = Settings().sandbox.options()
    servers = {
        "limits on, loop volumes": limits.model_copy(update={"slot_volume": "loop"}),
        "limits on, checked volumes": limits.model_copy(update={"slot_volume": "checked"}),
        "limits off": LIMITS_OFF,
    }
    print(f"load average before: {load()}", flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        for index, (name, options) in enumerate(servers.items()):
            rows.append(await measure(name, options, Path(tmp) / str(index), args.rounds))
    print(f"load average after: {load()}", flush=True)
    print(json.dumps(rows))


if __name__ == "__main__":
    asyncio.run(main())
