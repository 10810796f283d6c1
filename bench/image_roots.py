"""Two ways to run a slot's command on an item image, against today's slot, on this machine.

Issue 41 asks to measure both before choosing:

- `host`: today's slot: bubblewrap over the host's own system folders (read-only), `true` in it;
- `image`: bubblewrap with the image's root as `/`: the image mounted once (`podman image mount`),
  a kernel overlay per slot (the image below, the slot's writable layer above), `true` in it;
- `podman`: the sandbox server inside a podman container of the image: `podman exec C true`
  into a running container (and `podman run -d` to start one, the price of each new container).

Each variant runs `--commands` commands; the figures are the wall time per command and the CPU
time the command's own processes (bwrap, podman, conmon, runc) used, from `RUSAGE_CHILDREN`.
The `image` variant also times what a slot's first command pays once: the overlay mount.

`--builds` first times the builds of the image tasks' contexts (`envs/terminal_tasks/image_tasks/*/environment`) in
a fresh store, one after the other (the base image imported, apt from the Debian mirror), then
asks for each again: the second round is what a second batch over the same tasks pays (a key found).

`--slots` (with `--builds`: it runs on the `pytest` task's image) then compares the product's slots
on a real sandbox server each: a slot on the host's root against a slot on the image (idmapped
layers under an overlay on the slot's volume). For each: a fresh lease's first command (acquire to
output; the image slot mounts its root on the lease), and resident tool calls with the server's CPU
per call (`bench/tools.py`'s round trips).

    python bench/image_roots.py                 # 40 commands per variant
    python bench/image_roots.py --commands 100 --allow-busy
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import quiet  # noqa: E402
from temporal_rollouts.core.settings import ImageSettings, PoolOptions, SandboxSettings  # noqa: E402
from temporal_rollouts.sandbox.images.base_images import default_cache  # noqa: E402
from temporal_rollouts.sandbox.images.builder import ImageBuilder  # noqa: E402
from temporal_rollouts.core.images import ImageSpec  # noqa: E402
from temporal_rollouts.sandbox.images.store import ImageStore  # noqa: E402
from temporal_rollouts.sandbox.backends.local import LocalBackend  # noqa: E402
from temporal_rollouts.sandbox.pool import SandboxPool  # noqa: E402
from temporal_rollouts.sandbox_server.isolation.bubblewrap import bubblewrap_argv, bubblewrap_path  # noqa: E402
from temporal_rollouts.sandbox_server.schema import ExecOp, Holder  # noqa: E402
from bench.tools import round_trips  # noqa: E402

FIGURES: dict[str, float] = {}
IMAGE_TASKS = Path(__file__).resolve().parent.parent / "envs" / "terminal_tasks" / "image_tasks"
"""The image tasks (Harbor folders): each builds from its `environment/`."""


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(argv: list[str], count: int, env: dict[str, str] | None = None) -> tuple[list[float], float]:
    """Wall seconds of each run of `argv`, and the CPU seconds all of them used."""
    walls = []
    cpu_before = children_cpu_s()
    for _ in range(count):
        started = time.perf_counter()
        subprocess.run(argv, check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        walls.append(time.perf_counter() - started)
    return walls, children_cpu_s() - cpu_before


def report(name: str, walls: list[float], cpu_s: float) -> None:
    walls = sorted(walls)
    median_ms = statistics.median(walls) * 1000
    p95_ms = walls[int(0.95 * (len(walls) - 1))] * 1000
    cpu_ms = cpu_s / len(walls) * 1000
    FIGURES[f"{name}_median_ms"] = round(median_ms, 2)
    FIGURES[f"{name}_p95_ms"] = round(p95_ms, 2)
    FIGURES[f"{name}_cpu_ms"] = round(cpu_ms, 2)
    print(
        f"{name:<8} median {median_ms:7.1f} ms   p95 {p95_ms:7.1f} ms   cpu {cpu_ms:6.1f} ms/command   n={len(walls)}"
    )


async def time_builds(builder: ImageBuilder) -> None:
    """Each image task's build in this (fresh) store, then the same request again (found by its key)."""
    specs = [
        ImageSpec(context=str(folder / "environment"), name=folder.name)
        for folder in sorted(IMAGE_TASKS.iterdir())
        if (folder / "environment" / "Dockerfile").is_file()
    ]
    for phase in ("build", "again"):
        for spec in specs:
            started = time.perf_counter()
            await builder.ready(spec, "the benchmark")
            seconds = time.perf_counter() - started
            FIGURES[f"{phase}_{spec.name}_s"] = round(seconds, 3)
            print(f"{phase:<6} {spec.name:<16} {seconds:8.3f} s")


async def time_slots(builder: ImageBuilder, data: Path, rounds: int) -> None:
    """A fresh lease's first command and resident tool calls, on the host's root and on the pytest task's image."""
    context = IMAGE_TASKS / "fix-median-with-pytest" / "environment"
    image = await builder.ready(ImageSpec(context=str(context), name="pytest"), "the benchmark")
    backend = LocalBackend(data, SandboxSettings(slots_per_container=1), images=builder)
    async with SandboxPool(backend, PoolOptions(min_containers=0, max_containers=2)) as pool:
        try:
            for name, on in (("host_slot", None), ("image_slot", image)):
                firsts = []
                for index in range(rounds // 4 + 1):
                    started = time.perf_counter()
                    lease = await pool.acquire(Holder(workflow_id=f"bench-{name}"), ttl_s=600, wait_s=120, image=on)
                    output = await pool.lease(lease).execute(f"first-{index}", ExecOp(command="echo ping"))
                    if index:  # the first lease also starts the container
                        firsts.append(time.perf_counter() - started)
                    assert output.ok, output
                    await pool.release(lease)
                FIGURES[f"{name}_first_command_ms"] = round(statistics.median(firsts) * 1000, 1)
                lease = await pool.acquire(Holder(workflow_id=f"bench-{name}"), ttl_s=600, wait_s=120, image=on)
                (info,) = [c for c in backend.registry.load() if c.container_id == lease.container_id]
                assert info.pid is not None
                calls = await round_trips(
                    pool, lease, rounds, lambda: ExecOp(command="echo ping", resident=True), info.pid
                )
                await pool.release(lease)
                for key, value in calls.items():
                    FIGURES[f"{name}_tool_{key}"] = value
                print(f"{name:<10} first command {FIGURES[f'{name}_first_command_ms']:7.1f} ms   tool call {calls}")
        finally:
            for info in backend.registry.load():
                await backend.stop_container(info.container_id)


def unmount_under(folder: str) -> None:
    """Unmount everything under `folder`, deepest first, until nothing is left (containers-storage may
    have mounted its overlay home over itself more than once: one pass leaves a mount, and the folder busy)."""
    for _ in range(10):
        mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
        points = sorted((point for point in mounts if point.startswith(folder + "/")), key=len, reverse=True)
        if not points:
            return
        for point in points:
            subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def overlay_argv(bwrap: str, merged: Path) -> list[str]:
    return [
        bwrap,
        "--bind", str(merged), "/",
        "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp",
        "--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-net", "--unshare-cgroup-try",
        "--die-with-parent", "--new-session", "--chdir", "/",
        "true",
    ]  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commands", type=int, default=40)
    parser.add_argument("--builds", action="store_true", help="also time the image tasks' builds, cold and again")
    parser.add_argument("--slots", action="store_true", help="also compare the product's host-root and image slots")
    quiet.add_argument(parser)
    args = parser.parse_args()
    host = quiet.check_host(args.allow_busy)
    bwrap = bubblewrap_path()
    if bwrap is None:
        raise SystemExit("bubblewrap cannot build a sandbox here")
    with tempfile.TemporaryDirectory(prefix="image-roots-") as scratch:
        work = Path(scratch)
        store = ImageStore(work / "store")
        builder = ImageBuilder(ImageSettings(base_cache=default_cache()), store)
        started = time.perf_counter()
        image = await builder.ready(ImageSpec(reference="debian:bookworm-slim"), "the benchmark")
        FIGURES["base_import_s"] = round(time.perf_counter() - started, 3)
        print(f"base image ready in the fresh store: {FIGURES['base_import_s']:.1f} s")
        if args.builds:
            await time_builds(builder)
        env = store.environment()
        workspace = work / "workspace"
        workspace.mkdir()
        try:
            report("host", *timed(bubblewrap_argv(bwrap, workspace, ["true"], allow_network=False), args.commands))

            root = await store.mount(image.name)
            mounts = []
            for index in range(args.commands):
                layer = work / f"slot-{index}"
                for part in ("upper", "work", "merged"):
                    (layer / part).mkdir(parents=True)
                started = time.perf_counter()
                options = f"lowerdir={root},upperdir={layer / 'upper'},workdir={layer / 'work'}"
                subprocess.run(["mount", "-t", "overlay", "overlay", "-o", options, str(layer / "merged")], check=True)
                mounts.append(time.perf_counter() - started)
            report("mount", mounts, 0.0)
            report("image", *timed(overlay_argv(bwrap, work / "slot-0" / "merged"), args.commands))
            for index in range(args.commands):
                subprocess.run(["umount", str(work / f"slot-{index}" / "merged")], check=False)
            await store.unmount(image.name)

            started = time.perf_counter()
            run = subprocess.run(
                ["podman", "run", "-d", "--rm", "--network=none", image.name, "sleep", "infinity"],
                check=True, capture_output=True, text=True, env=env,
            )  # fmt: skip
            FIGURES["podman_run_ms"] = round((time.perf_counter() - started) * 1000, 1)
            container = run.stdout.strip()
            print(f"podman run -d: {FIGURES['podman_run_ms']:.0f} ms")
            try:
                report("podman", *timed(["podman", "exec", container, "true"], args.commands, env))
            finally:
                subprocess.run(["podman", "rm", "-f", "-t", "0", container], env=env, capture_output=True, check=False)
            if args.slots:  # last: its servers are children too, and would count in the variants' CPU
                await time_slots(builder, work / "data", args.commands)
        finally:
            unmount_under(scratch)
    print(json.dumps({"bench": "image_roots", **FIGURES, **host.report()}))


if __name__ == "__main__":
    asyncio.run(main())
