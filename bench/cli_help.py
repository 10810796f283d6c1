"""How long `rollouts --help` takes: wall and CPU seconds of the real command, started afresh each time.

    python bench/cli_help.py [--runs 10]

It prints the median and the worst of `rollouts --help` (and of `rollouts batch --help`, which
also lists the registered envs), with the load average before and after: the figure is only a
figure on a quiet machine. The target is under 0.3 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROLLOUTS = Path(sys.executable).with_name("rollouts")


def timed(argv: list[str]) -> tuple[float, float]:
    """(wall s, CPU s of the child) of one run of `argv`."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    command = [str(ROLLOUTS)] if ROLLOUTS.exists() else [sys.executable, "-m", "temporal_rollouts.cli"]
    load_before = os.getloadavg()
    figures = {}
    for name, extra in (("help", ["--help"]), ("batch_help", ["batch", "--help"])):
        timed([*command, *extra])  # the first run fills the page cache
        runs = [timed([*command, *extra]) for _ in range(args.runs)]
        walls, cpus = [wall for wall, _ in runs], [cpu for _, cpu in runs]
        figures[name] = {
            "wall_s_median": round(statistics.median(walls), 3),
            "wall_s_max": round(max(walls), 3),
            "cpu_s_median": round(statistics.median(cpus), 3),
        }
    print(
        json.dumps(
            {
                "bench": "cli_help",
                "runs": args.runs,
                **figures,
                "load_before": [round(x, 2) for x in load_before],
                "load_after": [round(x, 2) for x in os.getloadavg()],
            }
        )
    )


if __name__ == "__main__":
    main()
