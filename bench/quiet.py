"""A benchmark's figures mean something only from a quiet machine.

Per-step CPU doubles under contention (two cores, another job running), so a figure measured on
a busy host is not a figure. Before measuring, a benchmark samples the host: its load average
and how busy its CPUs were over a few seconds. A busy host is refused, with the numbers, unless
`--allow-busy`, and then every figure the run prints is marked `"busy_machine": true`. The load
average before and after goes into the run's JSON line either way.
"""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import dataclass

from bench.procs import host_cpu

MAX_LOAD = 1.5
"""The one-minute load average above which a 2-core host is busy before a run starts."""
MAX_BUSY = 0.25
"""The share of the host's CPU time in use, over the sample, above which it is busy."""
SAMPLE_S = 3.0


@dataclass(frozen=True)
class HostBefore:
    load: tuple[float, float, float]
    busy_share: float
    busy: bool

    def report(self) -> dict:
        """What goes into the run's JSON line: the load before and after, and whether it was busy."""
        return {
            "load_before": [round(x, 2) for x in self.load],
            "load_after": [round(x, 2) for x in os.getloadavg()],
            "host_busy_before": round(self.busy_share, 3),
            "busy_machine": self.busy,
        }


def add_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-busy", action="store_true", help="run on a busy host anyway; every figure is then marked busy_machine"
    )


def check_host(allow_busy: bool) -> HostBefore:
    """Sample the host before a run: refuse a busy one (SystemExit naming why) unless `allow_busy`."""
    load = os.getloadavg()
    busy_before, total_before = host_cpu()
    time.sleep(SAMPLE_S)
    busy_after, total_after = host_cpu()
    share = (busy_after - busy_before) / max(total_after - total_before, 1e-9)
    busy = load[0] > MAX_LOAD or share > MAX_BUSY
    print(
        f"host before the run: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{100 * share:.0f}% busy over {SAMPLE_S:.0f}s" + (" -- BUSY" if busy else ""),
        flush=True,
    )
    if busy and not allow_busy:
        raise SystemExit(
            f"the host is busy (load {load[0]:.2f} > {MAX_LOAD} or {100 * share:.0f}% > {100 * MAX_BUSY:.0f}% busy): "
            "figures from a busy machine are not figures. Stop the other work and run again, or pass --allow-busy "
            "to run anyway with every figure marked busy_machine."
        )
    return HostBefore(load, share, busy)
