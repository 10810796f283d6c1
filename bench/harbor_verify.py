"""What a Harbor task's verification costs: a plain check, the verifier on the root the agent changed
(`shared`) and on the image as built (`pristine`), on a real sandbox server with an item image.
The test is the same in each: python3 reads the agent's answer and a reward is written.

Each variant runs `--runs` times in one slot whose WORKDIR holds `--files` small files (the agent's work,
carried into the pristine root): a plain one-shot `exec` of the test (what a check without folders of its
own costs), then `bash /tests/test.sh` as a verifier command with the tests read-only at /tests and a fresh
/logs/verifier, whose reward the server reads back. The figures are the wall time per verification, from
the request to the answer, and the server's CPU per verification (its own process, from /proc).

    python bench/harbor_verify.py                 # 20 runs per variant
    python bench/harbor_verify.py --runs 50 --files 5000
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
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from bench.image_roots import unmount_under  # noqa: E402
from envs.harbor.env import _pack  # noqa: E402
from temporal_rollouts.core.images import ImageSpec  # noqa: E402
from temporal_rollouts.core.settings import ImageSettings, PoolOptions, SandboxSettings  # noqa: E402
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.handle import LeasedSlot  # noqa: E402
from temporal_rollouts.sandbox.images.base_images import default_cache  # noqa: E402
from temporal_rollouts.sandbox.images.builder import ImageBuilder  # noqa: E402
from temporal_rollouts.sandbox.images.store import ImageStore  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder, VerifierMounts  # noqa: E402

DOCKERFILE = """\
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
"""
TEST = """\
python3 -c 'import sys; sys.exit(open("/app/answer").read().strip() != "42")' \\
    && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""


def cpu_s(pid: int) -> float:
    """A process's CPU seconds so far (user + system, its own threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def measure(name: str, runs: int, once, pid: int, figures: dict) -> None:
    walls, before = [], cpu_s(pid)
    for _ in range(runs):
        started = time.perf_counter()
        await once()
        walls.append(time.perf_counter() - started)
    cpu = (cpu_s(pid) - before) / runs
    walls.sort()
    figures[f"{name}_median_ms"] = round(statistics.median(walls) * 1000, 1)
    figures[f"{name}_p95_ms"] = round(walls[int(0.95 * (len(walls) - 1))] * 1000, 1)
    figures[f"{name}_server_cpu_ms"] = round(cpu * 1000, 1)
    print(
        f"{name:<10} median {figures[f'{name}_median_ms']:7.1f} ms   p95 {figures[f'{name}_p95_ms']:7.1f} ms   "
        f"server CPU {figures[f'{name}_server_cpu_ms']:6.1f} ms"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--files", type=int, default=1000, help="files the agent left in WORKDIR")
    quiet.add_argument(parser)
    args = parser.parse_args()
    host = quiet.check_host(args.allow_busy)
    figures: dict = {"runs": args.runs, "files": args.files}
    with tempfile.TemporaryDirectory(prefix="harbor-verify-") as scratch:
        work = Path(scratch)
        (work / "context").mkdir()
        (work / "context" / "Dockerfile").write_text(DOCKERFILE)
        (work / "tests").mkdir()
        (work / "tests" / "test.sh").write_text(TEST)
        (work / "tests.tar.gz").write_bytes(_pack(work / "tests"))
        builder = ImageBuilder(ImageSettings(base_cache=default_cache()), ImageStore(work / "store"))
        image = await builder.ready(ImageSpec(context=str(work / "context"), name="harbor-bench"), "the benchmark")
        backend = LocalBackend(work / "data", SandboxSettings(slots_per_container=1), images=builder)
        async with SandboxPool(backend, PoolOptions(min_containers=0, max_containers=1)) as pool:
            try:
                lease = await pool.acquire(Holder(workflow_id="bench-harbor"), ttl_s=600, wait_s=120, image=image)
                (info,) = [c for c in backend.registry.load() if c.container_id == lease.container_id]
                assert info.pid is not None
                slot = LeasedSlot(pool, lease, uuid.uuid4().hex[:8])
                made = f"cd /app && echo 42 > answer && mkdir -p src && for i in $(seq {args.files}); do echo $i > src/f$i; done"
                assert (await slot.terminal(made, timeout=600)).ok
                await slot.share("bench-tests", work / "tests.tar.gz")
                await slot.stop_processes()

                async def plain() -> None:
                    plain_test = TEST.replace("/logs/verifier", "/tmp")  # the same test, without folders of its own
                    out = await slot.execute(f"p-{uuid.uuid4().hex[:8]}", ExecOp(command=plain_test))
                    assert out.ok, out

                def verifier(pristine: bool):
                    async def once() -> None:
                        mounts = VerifierMounts(tests="bench-tests", pristine=pristine)
                        out = await slot.verifier("bash /tests/test.sh", mounts, timeout=60)
                        assert out.collected["reward.txt"].text.strip() == "1", out

                    return once

                await measure("plain", args.runs, plain, info.pid, figures)
                await measure("shared", args.runs, verifier(False), info.pid, figures)
                await measure("pristine", args.runs, verifier(True), info.pid, figures)
            finally:
                for container in backend.registry.load():
                    await backend.stop_container(container.container_id)
        unmount_under(scratch)  # what containers-storage left mounted
    print(json.dumps({"bench": "harbor_verify", **figures, **host.report()}))


if __name__ == "__main__":
    asyncio.run(main())
