"""What slot confinement costs: the round trip of `true` with limits on and off, and a slot reset.

Starts two real sandbox servers (LocalBackend, one slot each): one with the default limits
of `SandboxSettings` (cgroups or rlimits, a sized /tmp, a dedicated uid when run as root),
one with every limit off. Then:

- `true` round trip: client `execute` of `ExecOp("true")`, request to reply, on each server;
- reset of a slot holding 10,000 files: the release call (it returns once the slot is
  reset: the workspace moved aside and a fresh one made), then the time until the old tree
  is deleted in the background.

    python bench/sandbox_limits.py             # 40 rounds of `true` per server
    python bench/sandbox_limits.py --rounds 10

The last line printed is one JSON object with the headline figures.
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

from temporal_rollouts.core.settings import Settings
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

LIMITS_OFF = ServerOptions(limits=SlotLimits.off())
FILES = 10_000


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
    while any(path.name.startswith("trash-") for path in slot_dir.iterdir()):
        await asyncio.sleep(0.01)
    deleted = time.perf_counter() - started
    again = await client.send(AcquireRequest(holder=holder(), ttl_s=600, wait_s=30))
    listing = await client.send(run_in(again, "ls", ExecOp(command="ls -A | wc -l")))
    assert listing.output.strip() == "0", listing.output
    await client.send(ReleaseRequest(slot=again.slot, lease_id=again.lease_id))
    return reset, deleted


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-limits-") as tmp:
        on = LocalBackend(Path(tmp) / "on", slots_per_container=1, server=Settings().sandbox.options())
        off = LocalBackend(Path(tmp) / "off", slots_per_container=1, server=LIMITS_OFF)
        started = []
        try:
            for backend in (on, off):
                started.append((backend, await backend.start_container()))
            (_, on_info), (_, off_info) = started
            async with (
                SandboxClient(on_info.url, on_info.read_token(), timeout=60) as on_client,
                SandboxClient(off_info.url, off_info.read_token(), timeout=60) as off_client,
            ):
                health = await on_client.send(HealthQuery())
                print("limits in force:", json.dumps(health.limits))
                with_limits = await true_round_trips(on_client, args.rounds)
                without = await true_round_trips(off_client, args.rounds)
                print(f"`true` with limits:    {summary(with_limits)}")
                print(f"`true` without limits: {summary(without)}")
                slot_dir = on.container_dir(on_info.container_id) / "root" / "slot-0"
                reset, deleted = await reset_of_many_files(on_client, slot_dir)
                print(
                    f"reset of a slot holding {FILES} files: {reset * 1000:.1f} ms to hand on, "
                    f"old tree deleted after {deleted * 1000:.1f} ms"
                )
        finally:
            for backend, info in started:
                await backend.stop_container(info.container_id)
    print(
        json.dumps(
            {
                "true_rtt_limits_on_median_ms": summary(with_limits)["median_ms"],
                "true_rtt_limits_off_median_ms": summary(without)["median_ms"],
                "true_rtt_limits_on_p95_ms": summary(with_limits)["p95_ms"],
                "true_rtt_limits_off_p95_ms": summary(without)["p95_ms"],
                "reset_10k_files_ms": round(reset * 1000, 1),
                "reset_10k_files_trash_deleted_ms": round(deleted * 1000, 1),
                "limits": health.limits,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
