"""What an SWE-smith rollout costs outside the model: workspace setup and verification.

Starts one real sandbox server (LocalBackend, default slot limits, bubblewrap when the host
has it) and, for a few shipped instances (one per project by default), in fresh slots:

- setup, three times, each in a freshly reset slot:
  `setup_cold_s`: nothing cached anywhere (the worker makes the bare repository and packs it and
  the wheels, the container's cache is emptied first, so both are put);
  `setup_container_cold_s`: the worker has them packed, the container's cache is emptied, so both
  are streamed in and unpacked (what the first rollout of a repository on a container pays);
  `setup_warm_s`: the container's cache holds them, nothing is sent (every later rollout);
  each then checks base_commit out of the cache (`git archive`) into the slot;
- verify at base_commit with the original's chunks of 50 test ids: copy the wheels from the
  cache, restore the tests, venv + `pip install -e .` offline, pytest per chunk.

    python bench/swe.py                 # one instance per shipped project
    python bench/swe.py --instances 4

The last line printed is one JSON object with the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from envs import get_env  # noqa: E402
from envs.swe_smith import transfer  # noqa: E402
from envs.swe_smith.config import SHIPPED_INSTANCES  # noqa: E402
from envs.swe_smith.loader import read_instances  # noqa: E402
from temporal_rollouts.core.settings import PoolOptions, Settings  # noqa: E402
from temporal_rollouts.core.tasks import Item  # noqa: E402
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.handle import LeasedSlot  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.schema import Holder  # noqa: E402


def pick(count: int | None) -> list[str]:
    """One instance per project, then more round-robin, up to `count`."""
    by_repo: dict[str, list[str]] = {}
    for instance in read_instances(SHIPPED_INSTANCES).values():
        by_repo.setdefault(instance.repo, []).append(instance.instance_id)
    picked: list[str] = []
    while any(by_repo.values()) and len(picked) < (count or len(by_repo)):
        for ids in by_repo.values():
            if ids and len(picked) < (count or len(by_repo)):
                picked.append(ids.pop(0))
    return picked


async def timed(awaitable) -> tuple[float, object]:
    started = time.perf_counter()
    value = await awaitable
    return time.perf_counter() - started, value


def empty_container_cache(backend: LocalBackend, container_id: str) -> None:
    """Drop every entry of the container's cache (the host's folder: the bench runs the local backend)."""
    for entry in (backend.container_dir(container_id) / "root" / "cache").iterdir():
        if not entry.name.startswith("."):
            shutil.rmtree(entry)


async def measure(pool: SandboxPool, backend: LocalBackend, instance_id: str) -> dict:
    env = get_env("swe_smith")
    item = Item(id=instance_id)
    row: dict = {"instance_id": instance_id}
    run = uuid.uuid4().hex[:8]  # call ids must be new: the sandbox answers a known one from its stored result
    for phase in ("setup_cold_s", "setup_container_cold_s", "setup_warm_s"):
        lease = await pool.acquire(Holder(workflow_id=f"bench-{uuid.uuid4().hex[:8]}"), ttl_s=1800, wait_s=60)
        try:
            if phase == "setup_cold_s":
                transfer.REPOSITORY_ENTRIES.clear()
                transfer.WHEELS_ENTRIES.clear()
            if phase != "setup_warm_s":
                empty_container_cache(backend, lease.container_id)
            row[phase], meta = await timed(env.setup_workspace(item, LeasedSlot(pool, lease, f"{run}/{phase}/setup")))
            if phase == "setup_warm_s":
                row["verify_s"], verdict = await timed(
                    env.verify(item, LeasedSlot(pool, lease, f"{run}/verify", meta=meta), [])
                )
                instance = env.instance(item)
                row["tests"] = len(instance.FAIL_TO_PASS) + len(instance.PASS_TO_PASS)
                row["chunks"] = -(-row["tests"] // 50)
                row["score"] = verdict.score
                assert verdict.details["installed"], verdict.details
        finally:
            await pool.release(lease)
    return {k: round(v, 2) if isinstance(v, float) else v for k, v in row.items()}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--instances", type=int, default=None, help="how many (default: one per project)")
    args = parser.parse_args()
    ids = pick(args.instances)
    with tempfile.TemporaryDirectory(prefix="bench-swe-") as tmp:
        backend = LocalBackend(Path(tmp), Settings().sandbox.model_copy(update={"slots_per_container": 1}))
        pool = SandboxPool(backend, PoolOptions(max_containers=1))
        try:
            await pool.fleet.ensure_running()
            rows = []
            for instance_id in ids:
                rows.append(await measure(pool, backend, instance_id))
                print(json.dumps(rows[-1]))
        finally:
            await pool.aclose()
            for container in await backend.list_containers():
                await backend.stop_container(container.container_id)
    median = {
        key: round(statistics.median(r[key] for r in rows), 2)
        for key in ("setup_cold_s", "setup_container_cold_s", "setup_warm_s", "verify_s")
    }
    print(json.dumps({"instances": len(rows), **{f"median_{k}": v for k, v in median.items()}, "rows": rows}))


if __name__ == "__main__":
    asyncio.run(main())
