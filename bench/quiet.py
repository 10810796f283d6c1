"""A benchmark's figures mean something only from a quiet machine.

Per-step CPU doubles under contention (two cores, another job running), so a figure measured on
a busy host is not a figure. Before measuring, a benchmark samples the host: its load average
and how busy its CPUs were over a few seconds. A busy host is refused, with the numbers, unless
`--allow-busy`, and then every figure the run prints is marked `"busy_machine": true`. The load
average before and after goes into the run's JSON line either way.

A quiet host can still be a slow one: on a shared VM the same loop of Python took anywhere from
400 to 900 ms from one second to the next (2026-11-26), with no other process running. So the run
also times a fixed loop before and after (`cpu_probe_ms`): when the two differ much, or differ from
another run's, CPU-ms figures differ by as much for no reason of the code's.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from dataclasses import dataclass

from bench.procs import busy_share, host_cpu

MAX_LOAD = 1.5
"""The one-minute load average above which a 2-core host is busy before a run starts."""
MAX_BUSY = 0.25
"""The share of the host's CPU time in use, over the sample, above which it is busy."""
SAMPLE_S = 3.0
PROBE_LOOPS, PROBE_REPEATS = 400_000, 5


def cpu_probe_ms() -> float:
    """CPU-ms for a fixed loop of Python (the median of a few): how fast this host runs code right now."""
    times = []
    for _ in range(PROBE_REPEATS):
        started, total = time.process_time(), 0
        for i in range(PROBE_LOOPS):
            total += i
        times.append((time.process_time() - started) * 1000)
    return round(statistics.median(times), 1)


@dataclass(frozen=True)
class HostBefore:
    load: tuple[float, float, float]
    busy_share: float
    busy: bool
    cpu_probe_ms: float = 0.0

    def report(self) -> dict:
        """What goes into the run's JSON line: the load before and after, and whether it was busy."""
        probe_after = cpu_probe_ms()
        print(f"cpu probe: {self.cpu_probe_ms:.1f} ms before the run, {probe_after:.1f} ms after", flush=True)
        return {
            "cpu_probe_ms": [self.cpu_probe_ms, probe_after],
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
    before = host_cpu()
    time.sleep(SAMPLE_S)
    share = busy_share(before, host_cpu())
    busy = load[0] > MAX_LOAD or share > MAX_BUSY
    probe = cpu_probe_ms()
    print(
        f"host before the run: load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, "
        f"{100 * share:.0f}% busy over {SAMPLE_S:.0f}s, cpu probe {probe:.1f} ms" + (" -- BUSY" if busy else ""),
        flush=True,
    )
    if busy and not allow_busy:
        raise SystemExit(
            f"the host is busy (load {load[0]:.2f} > {MAX_LOAD} or {100 * share:.0f}% > {100 * MAX_BUSY:.0f}% busy): "
            "figures from a busy machine are not figures. Stop the other work and run again, or pass --allow-busy "
            "to run anyway with every figure marked busy_machine."
        )
    return HostBefore(load, share, busy, probe)
