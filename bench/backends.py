"""Slot acquire, hand-over and a `true` round trip through every sandbox backend that can run here.

Each backend gets one container of `--slots` slots, driven through the same SandboxPool the
worker activities use (no Temporal):

- local: LocalBackend, a detached server process found through the registry file;
- static: a server process run "by someone else" on 127.0.0.2, token derived from a pool secret;
- nomad: NomadBackend through the real python-nomad client against tests/support/fake_nomad.py
  (a fake agent over HTTP; the task is a real server process);
- modal: ModalBackend against tests/support/fake_modal.py (the modal client's surface faked;
  the sandbox is a real server process; no tunnel, no network hop to Modal).

So the figures compare what each backend adds on one machine (listing and address lookups),
not a real cluster's network. Ends with one line of JSON with the medians in milliseconds.

    python bench/backends.py            # 30 rounds each
    python bench/backends.py --rounds 10
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
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporal_rollouts.core.settings import PoolOptions, SandboxSettings
from temporal_rollouts.core.settings import Settings  # noqa: E402
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.backends.modal import ModalBackend  # noqa: E402
from temporal_rollouts.sandbox.backends.tokens import derive_token  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder  # noqa: E402
from tests.support import REPO  # noqa: E402
from tests.support.fake_modal import FakeModal  # noqa: E402
from tests.support.fake_nomad import FakeNomad  # noqa: E402
from tests.support.sandbox_process import SandboxProcess  # noqa: E402

SECRET_ENV = "BENCH_POOL_SECRET"


def holder() -> Holder:
    return Holder(workflow_id=f"bench-{uuid.uuid4().hex[:8]}", run_id="r")


def pool_settings(data_dir: Path, slots: int, backend: dict) -> Settings:
    return Settings(
        data_dir=data_dir,
        sandbox={"backend": backend, "slots_per_container": slots, "min_containers": 1, "max_containers": 1},
    )


@asynccontextmanager
async def local_pool(tmp: Path, slots: int) -> AsyncIterator[SandboxPool]:
    backend = LocalBackend(tmp, SandboxSettings(slots_per_container=slots))
    async with SandboxPool(backend, PoolOptions(max_containers=1)) as pool:
        try:
            await pool.fleet.ensure_running()
            yield pool
        finally:
            await backend.shutdown()


@asynccontextmanager
async def static_pool(tmp: Path, slots: int) -> AsyncIterator[SandboxPool]:
    server = SandboxProcess(
        tmp / "server", "static-0", derive_token(os.environ[SECRET_ENV], "static-0"), host="127.0.0.2", slots=slots
    ).start()
    backend = {"type": "static", "servers": [{"container_id": "static-0", "url": server.url}], "secret_env": SECRET_ENV}
    try:
        async with SandboxPool.from_settings(pool_settings(tmp, slots, backend)) as pool:
            yield pool
    finally:
        server.stop()


@asynccontextmanager
async def nomad_pool(tmp: Path, slots: int) -> AsyncIterator[SandboxPool]:
    fake = FakeNomad(tmp / "nomad").start()
    backend = {
        "type": "nomad",
        "address": fake.address,
        "token_env": None,
        "secret_env": SECRET_ENV,
        "python": sys.executable,
        "pythonpath": str(REPO),
        "job_prefix": "bench",
    }
    try:
        async with SandboxPool.from_settings(pool_settings(tmp, slots, backend)) as pool:
            await pool.fleet.ensure_running()
            yield pool
            await pool.fleet.backend.shutdown()
    finally:
        fake.stop()


@asynccontextmanager
async def modal_pool(tmp: Path, slots: int) -> AsyncIterator[SandboxPool]:
    fake = FakeModal(tmp / "modal")
    settings = pool_settings(tmp, slots, {"type": "modal", "app_name": "bench", "secret_env": SECRET_ENV})
    try:
        async with SandboxPool.from_settings(settings, ModalBackend.from_settings(settings, modal_api=fake)) as pool:
            await pool.fleet.ensure_running()
            yield pool
            await pool.fleet.backend.shutdown()
    finally:
        fake.close()


async def measure(pool: SandboxPool, slots: int, rounds: int) -> dict[str, list[float]]:
    acquire, hand_over, true_trip = [], [], []
    for _ in range(rounds):
        started = time.perf_counter()
        lease = await pool.acquire(holder(), ttl_s=600, wait_s=10)
        acquire.append(time.perf_counter() - started)
        started = time.perf_counter()
        await pool.lease(lease).execute(uuid.uuid4().hex, ExecOp(command="true"))
        true_trip.append(time.perf_counter() - started)
        await pool.release(lease)
    held = [await pool.acquire(holder(), ttl_s=600, wait_s=10) for _ in range(slots)]
    for _ in range(rounds):
        waiter = asyncio.create_task(pool.acquire(holder(), ttl_s=600, wait_s=30))
        await asyncio.sleep(0.05)  # the waiter is in line
        released_at = time.perf_counter()
        await pool.release(held.pop(0))
        held.append(await waiter)
        hand_over.append(time.perf_counter() - released_at)
    for lease in held:
        await pool.release(lease)
    return {"acquire": acquire, "hand_over": hand_over, "true": true_trip}


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered) * 1000, ordered[int(0.95 * (len(ordered) - 1))] * 1000


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args(argv)
    os.environ.setdefault(SECRET_ENV, uuid.uuid4().hex + uuid.uuid4().hex)
    headline: dict[str, dict[str, float]] = {}
    print(f"{'backend':8} {'acquire (free slot)':>24} {'hand-over':>24} {'`true` round trip':>24}   (median / p95 ms)")
    for name, make in (("local", local_pool), ("static", static_pool), ("nomad", nomad_pool), ("modal", modal_pool)):
        with tempfile.TemporaryDirectory(prefix=f"rollouts-bench-{name}-") as tmp:
            async with make(Path(tmp), args.slots) as pool:
                figures = await measure(pool, args.slots, args.rounds)
        cells = {key: summary(values) for key, values in figures.items()}
        print(f"{name:8} " + " ".join(f"{f'{m:7.1f} / {p:7.1f}':>24}" for m, p in cells.values()))
        headline[name] = {f"{key}_median_ms": round(m, 2) for key, (m, _) in cells.items()}
    print(json.dumps({"rounds": args.rounds, "slots": args.slots, "backends": headline}))


if __name__ == "__main__":
    asyncio.run(main())
