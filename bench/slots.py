"""Slot acquire latency (free slot; hand-over to a waiter) and utilisation under saturation.

Runs against a real sandbox server process (LocalBackend), through the same SandboxPool the
worker activities use; no Temporal. Latencies are measured on both sides: by the client
(request to lease) and from the server's own lease log (release to next grant of that slot,
the workspace reset included).

    python bench/slots.py                  # 4 slots, 16 rollout-like holders, 15 s of saturation
    python bench/slots.py --quick
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

from temporal_rollouts.core.settings import PoolOptions, SandboxSettings
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox.requests import HealthQuery  # noqa: E402
from temporal_rollouts.sandbox_server.state.lease_log import (  # noqa: E402
    hand_over_latencies,
    idle_while_waiting,
    read_lease_events,
    utilisation,
)
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder  # noqa: E402


def holder() -> Holder:
    return Holder(workflow_id=f"bench-{uuid.uuid4().hex[:8]}", run_id="r")


FIGURES: dict[str, float] = {}
"""The headline figures, printed as the last line (JSON)."""


def ms(values: list[float], name: str | None = None) -> str:
    values = sorted(values)
    p95 = values[int(0.95 * (len(values) - 1))]
    if name:
        FIGURES[f"{name}_median_ms"] = round(statistics.median(values) * 1000, 2)
        FIGURES[f"{name}_p95_ms"] = round(p95 * 1000, 2)
    return f"median {statistics.median(values) * 1000:6.1f} ms   p95 {p95 * 1000:6.1f} ms   n={len(values)}"


async def free_slot_latency(pool: SandboxPool, rounds: int) -> list[float]:
    latencies = []
    for _ in range(rounds):
        started = time.perf_counter()
        lease = await pool.acquire(holder(), ttl_s=600, wait_s=10)
        latencies.append(time.perf_counter() - started)
        await pool.release(lease)
    return latencies


async def hand_over_latency(pool: SandboxPool, slots: int, rounds: int) -> list[float]:
    """All slots held; one waiter queues; a release hands it the slot. Client-side: release
    call start to the waiter's lease."""
    held = [await pool.acquire(holder(), ttl_s=600, wait_s=10) for _ in range(slots)]
    latencies = []
    for _ in range(rounds):
        waiter = asyncio.create_task(pool.acquire(holder(), ttl_s=600, wait_s=30))
        await asyncio.sleep(0.05)  # the waiter is in line
        released_at = time.perf_counter()
        await pool.release(held.pop(0))
        held.append(await waiter)
        latencies.append(time.perf_counter() - released_at)
    for lease in held:
        await pool.release(lease)
    return latencies


async def saturate(pool: SandboxPool, holders: int, seconds: float, work_s: float) -> tuple[float, float, int]:
    """`holders` loops of acquire -> one command of `work_s` -> release, for `seconds`."""
    deadline = time.time() + seconds
    done = 0

    async def loop() -> None:
        nonlocal done
        while time.time() < deadline:
            lease = await pool.acquire(holder(), ttl_s=600, wait_s=120)
            await pool.lease(lease).execute(uuid.uuid4().hex, ExecOp(command=f"sleep {work_s}", timeout_s=30))
            await pool.release(lease)
            done += 1

    start = time.time()
    await asyncio.gather(*(loop() for _ in range(holders)))
    return start, time.time(), done


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=4)
    parser.add_argument("--holders", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=15.0)
    parser.add_argument("--work-s", type=float, default=0.5, help="length of each holder's command")
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    rounds, seconds = (20, 5.0) if args.quick else (100, args.seconds)
    with tempfile.TemporaryDirectory(prefix="rollouts-bench-slots-") as tmp:
        backend = LocalBackend(
            Path(tmp), SandboxSettings(slots_per_container=args.slots, backend={"start_containers": False})
        )
        container = await backend.start_container()
        pool = SandboxPool(backend, PoolOptions(max_containers=1))
        try:
            await pool.fleet.ensure_running()
            root = backend.container_dir(container.container_id) / "root"
            health = await pool.fleet.send(container.container_id, HealthQuery())
            print(f"sandbox: 1 container x {args.slots} slots (isolation: {health.isolation})")
            print(f"acquire, free slot:       {ms(await free_slot_latency(pool, rounds), 'acquire')}")
            print(f"hand-over, client side:   {ms(await hand_over_latency(pool, args.slots, rounds), 'hand_over')}")
            print(f"hand-over, server log:    {ms(hand_over_latencies(read_lease_events(root)))}")
            before = len(read_lease_events(root))
            start, end, done = await saturate(pool, args.holders, seconds, args.work_s)
            events = read_lease_events(root)[before:]
            print(f"saturation: {args.holders} holders on {args.slots} slots for {end - start:.1f} s, {done} leases")
            FIGURES["utilisation"] = round(utilisation(events, args.slots, start, end), 4)
            print(f"  utilisation             {FIGURES['utilisation'] * 100:6.1f} %")
            print(f"  slot free while waiting {idle_while_waiting(events):6.3f} s in total")
            print(f"  hand-over (server log)  {ms(hand_over_latencies(events))}")
        finally:
            await pool.aclose()
            await backend.stop_container(container.container_id)
    print(json.dumps({"slots": args.slots, "holders": args.holders, **FIGURES}))


if __name__ == "__main__":
    asyncio.run(main())
