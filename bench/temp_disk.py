"""The disk a worker's swe_smith transfers leave in the temp dir over a long run: flat, not growing.

A worker turns every repository it sends to sandboxes into a bundle and a cache-entry archive
(`envs/swe_smith/transfer.py`, about 0.5 MB each); it used to leave each in a folder of the host's
temp dir forever. This runs what a long run does, in a temp dir of its own: `--repos` distinct
repositories (copies of a shipped one, one commit apart, so each has a digest of its own), each
sent `--rounds` times in a shuffled order, by `--workers` worker processes one after the other;
every worker but the last is SIGKILLed mid-run (a crash, no exit handlers). It prints the temp
dir's size after each worker and every `--every` builds inside one, then one JSON line.

    python bench/temp_disk.py                      # 120 repositories, 2 rounds, 4 workers
    python bench/temp_disk.py --repos 300 --workers 6

Expected: the size stops growing once a worker's cache is full (32 repositories, `scratch`), the
folder of a killed worker is gone once the next one builds, and nothing is left after the last exits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.quiet import add_argument, check_host  # noqa: E402
from envs.swe_smith.config import SweSmithConfig  # noqa: E402
from envs.swe_smith.loader import read_instances  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
WORKER = """
import json, os, sys, time
from pathlib import Path
from envs.swe_smith import transfer
base, every, names = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
temp = Path(os.environ["TMPDIR"])
for index, name in enumerate(names, 1):
    transfer.repository_entry(transfer.local_bundle(base, name))
    transfer.wheels_entry(os.environ["WHEELHOUSE"])
    if index % every == 0 or index == len(names):
        used = sum(f.stat().st_size for f in temp.rglob("*") if f.is_file())
        print(json.dumps({"built": index, "temp_bytes": used, "folders": len(list(temp.iterdir()))}), flush=True)
print("done", flush=True)
if os.environ.get("WAIT_TO_BE_KILLED"):
    time.sleep(3600)
"""
GIT = ["git", "-c", "user.name=bench", "-c", "user.email=bench@invalid", "-c", "commit.gpgsign=false"]


def make_repositories(bundle: Path, folder: Path, count: int) -> list[str]:
    """`count` git repositories cloned from `bundle`, each one commit apart from the others."""
    names = []
    for index in range(count):
        name = f"repo{index:04d}"
        target = folder / name
        subprocess.run(["git", "clone", "-q", str(bundle), str(target)], check=True)
        (target / "BENCH_NOTE").write_text(f"{index}\n")
        subprocess.run([*GIT, "-C", str(target), "add", "BENCH_NOTE"], check=True)
        subprocess.run([*GIT, "-C", str(target), "commit", "-q", "-m", f"bench {index}"], check=True)
        names.append(name)
    return names


def used_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def run_worker(names: list[str], base: Path, temp: Path, every: int, killed: bool) -> list[dict]:
    env = {**os.environ, "TMPDIR": str(temp), "PYTHONPATH": str(REPO), "WHEELHOUSE": SweSmithConfig().wheelhouse}
    if killed:
        env["WAIT_TO_BE_KILLED"] = "1"
    child = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(base), str(every), *names],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    samples = []
    for line in child.stdout:
        if line.strip() == "done":
            break
        samples.append(json.loads(line))
        print(f"    built {samples[-1]['built']:4d}: temp {samples[-1]['temp_bytes'] / 1e6:6.2f} MB", flush=True)
    if killed:
        child.send_signal(signal.SIGKILL)
    child.wait()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repos", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--every", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    add_argument(parser)
    args = parser.parse_args()
    host = check_host(allow_busy=True)  # bytes on disk do not depend on how busy the CPUs are
    settings = SweSmithConfig()
    instance = next(iter(read_instances(settings.dataset).values()))
    with tempfile.TemporaryDirectory(prefix="bench-temp-disk-") as scratch_dir:
        root = Path(scratch_dir)
        base, temp = root / "repos", root / "temp"
        base.mkdir()
        temp.mkdir()
        bundle = Path(settings.repo_base_url) / f"{instance.repo.replace('/', '__')}.bundle"
        if not bundle.is_file():
            bundle = next(Path(settings.repo_base_url).glob("*.bundle"))
        started = time.monotonic()
        names = make_repositories(bundle, base, args.repos)
        print(f"{len(names)} repositories made in {time.monotonic() - started:.0f}s", flush=True)
        order = [name for _ in range(args.rounds) for name in names]
        random.Random(args.seed).shuffle(order)
        share = -(-len(order) // args.workers)
        rows = []
        for worker in range(args.workers):
            killed = worker < args.workers - 1
            part = order[worker * share : (worker + 1) * share]
            print(f"  worker {worker + 1} ({'SIGKILLed at its end' if killed else 'exits'}): {len(part)} builds")
            samples = run_worker(part, base, temp, args.every, killed)
            after = used_bytes(temp)
            print(f"  after worker {worker + 1}: temp {after / 1e6:.2f} MB in {len(list(temp.iterdir()))} folders")
            rows.append(
                {
                    "worker": worker + 1,
                    "killed": killed,
                    "builds": len(part),
                    "max_temp_bytes": max((s["temp_bytes"] for s in samples), default=0),
                    "temp_bytes_after": after,
                }
            )
            if killed:
                time.sleep(11)  # past scratch.STARTING_S: the next worker's first build sweeps this one's folder
        shutil.rmtree(base)
        result = {
            "bench": "temp_disk",
            "repos": args.repos,
            "builds": len(order),
            "workers": rows,
            "max_temp_mb": round(max(r["max_temp_bytes"] for r in rows) / 1e6, 2),
            "left_after_last_exit_bytes": rows[-1]["temp_bytes_after"],
            **host.report(),
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
