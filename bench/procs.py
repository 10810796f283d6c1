"""The real processes the orchestration benchmark runs against, and their cleanup.

The demo policy and a sandbox server run as their own processes, Temporal as the dev
server (with the project's tuning), and the worker either as `python worker.py` in its
own process (the default, as in production) or built in this process. Every process
is stopped by its pid when the block exits, Ctrl-C and SIGTERM included;
`kill_leftover_children` is the last resort for a second Ctrl-C during cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from temporal_rollouts.core.settings import SandboxSettings
from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.services import wait_for_port
from temporal_rollouts.runtime.temporal import FAST_STEP_FLAGS, temporal_binary
from temporal_rollouts.runtime.worker_processes import metrics_address_of
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.pool import SandboxPool

REPO = Path(__file__).resolve().parent.parent
TASK_QUEUE = "bench"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass
class Stack:
    settings: Settings
    client: Client
    pool: SandboxPool
    pids: dict[str, int] = field(default_factory=dict)  # role -> pid, for CPU accounting

    async def worker_cache(self, processes: int = 1) -> dict[str, float]:
        """The worker processes' sticky cache counters (hits, misses, forced evictions) from their
        metrics endpoints, summed; an empty dict where the worker serves none."""
        return await workflow_cache_counts(self.settings.worker.metrics_address, processes)


CACHE_COUNTERS = {
    "temporal_sticky_cache_hit": "hits",
    "temporal_sticky_cache_miss": "misses",
    "temporal_sticky_cache_total_forced_eviction": "evictions",
}


async def workflow_cache_counts(metrics_address: str | None, processes: int = 1) -> dict[str, float]:
    """Sum of the SDK's sticky cache counters over the worker processes serving metrics from
    `metrics_address` on (process k on port + k - 1, as `python worker.py` numbers them)."""
    if metrics_address is None:
        return {}
    counts = dict.fromkeys(CACHE_COUNTERS.values(), 0.0)
    async with httpx.AsyncClient(timeout=10) as http:
        for k in range(1, processes + 1):
            text = (await http.get(f"http://{metrics_address_of(metrics_address, k)}/metrics")).text
            for line in text.splitlines():
                name = line.partition("{")[0].split(" ")[0]
                if name in CACHE_COUNTERS:
                    counts[CACHE_COUNTERS[name]] += float(line.rsplit(" ", 1)[1])
    return counts


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _stat(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()


def _children_by_parent() -> dict[int, list[int]]:
    """Every live process's pid under its parent's, from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                parents.setdefault(int(_stat(int(entry.name))[1]), []).append(int(entry.name))
    return parents


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process, its reaped children (the sandbox's bwrap/bash) and its live
    descendants (`python worker.py --processes N`'s other worker processes): a child's CPU moves
    from the live ones to the reaped ones when it exits, so the sum only grows. This process's
    live children are the services it measures, so for itself it counts only its own CPU."""
    parents = _children_by_parent() if pid != os.getpid() else {}
    total, todo = 0.0, [pid]
    while todo:
        current = todo.pop()
        try:
            fields = _stat(current)
        except OSError:
            continue
        total += sum(int(value) for value in fields[11:15]) / CLOCK_TICKS  # utime, stime, cutime, cstime
        todo.extend(parents.get(current, []))
    return total


def host_cpu() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far: what else ran shows as busy here."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:9]]
    idle = values[3] + values[4]  # idle + iowait
    return (sum(values) - idle) / CLOCK_TICKS, sum(values) / CLOCK_TICKS


def busy_share(before: tuple[float, float], after: tuple[float, float]) -> float:
    """The share of the machine's CPU time in use between two `host_cpu()` readings."""
    return (after[0] - before[0]) / max(after[1] - before[1], 1e-9)


def _my_children() -> dict[int, str]:
    found = {}
    for pid in _children_by_parent().get(os.getpid(), []):
        with contextlib.suppress(OSError):
            found[pid] = Path(f"/proc/{pid}/comm").read_text().strip()
    return found


def kill_leftover_children(data_dir: Path | None = None) -> None:
    """SIGKILL whatever this process started and is still alive, and any process whose command
    line names our private data directory (a sandbox server restarted by the worker's pool)."""
    pids = set(_my_children())
    if data_dir is not None:
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(OSError):
                if entry.name.isdigit() and str(data_dir) in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    pids.add(int(entry.name))
    for pid in pids - {os.getpid()}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def run_in_data_dir(prefix: str, keep: bool, amain: Callable[[Path], Awaitable[object]]) -> int:
    """Run `amain(data_dir)` in a fresh temporary folder; whatever happens, stop every process it
    started and remove the folder (unless `keep`). 0, or 130 after Ctrl-C or SIGTERM."""
    data_dir = Path(tempfile.mkdtemp(prefix=prefix))
    code = 0
    try:
        asyncio.run(amain(data_dir))
    except (KeyboardInterrupt, asyncio.CancelledError):
        print("\ninterrupted; every process this benchmark started was stopped", file=sys.stderr)
        code = 130
    finally:
        kill_leftover_children(data_dir)
        if keep:
            print(f"data directory kept: {data_dir}", file=sys.stderr)
        else:
            for _ in range(10):  # a just-stopped server may still be emptying a workspace
                shutil.rmtree(data_dir, ignore_errors=True)
                if not data_dir.exists():
                    break
                time.sleep(0.5)
            else:
                print(f"could not remove the data directory {data_dir}", file=sys.stderr)
    return code


def _spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    with open(log_path, "ab") as log:
        # Own session: a Ctrl-C reaches only us, and we stop the children in order.
        return subprocess.Popen(
            argv,
            cwd=REPO,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen, timeout_s: float = 10.0) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


async def _wait_for_line(log_path: Path, text: str, proc: subprocess.Popen, wait_s: float = 60.0) -> None:
    deadline = time.monotonic() + wait_s
    while text not in log_path.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"{proc.args} did not get ready; see {log_path}")
        await asyncio.sleep(0.05)


@contextlib.contextmanager
def _output_to(log_path: Path) -> Iterator[None]:
    """Point file descriptors 1 and 2 at a log while a child that inherits them is started."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with open(log_path, "ab") as log:
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


def _env_vars(settings: Settings) -> dict[str, str]:
    """The same settings, as the ROLLOUTS_* variables `python worker.py` reads."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    env.update(
        {
            "ROLLOUTS_DATA_DIR": str(settings.data_dir),
            "ROLLOUTS_TEMPORAL__ADDRESS": settings.temporal_address,
            "ROLLOUTS_TEMPORAL__TASK_QUEUE": settings.temporal.task_queue,
            "ROLLOUTS_DEMO_POLICY__PORT": str(settings.demo_policy.port),
            "ROLLOUTS_DEMO_POLICY__START_LOCAL": "false",
            "ROLLOUTS_SANDBOX__START_LOCAL": "false",
            "ROLLOUTS_SANDBOX__SLOTS_PER_CONTAINER": str(settings.sandbox.slots_per_container),
            "ROLLOUTS_WORKER__GRACEFUL_SHUTDOWN_S": str(settings.worker.graceful_shutdown_s),
        }
    )
    if settings.worker.metrics_address:
        env["ROLLOUTS_WORKER__METRICS_ADDRESS"] = settings.worker.metrics_address
    return env


@contextlib.asynccontextmanager
async def temporal_dev_server(
    data_dir: Path, *, db_file: bool = False
) -> AsyncIterator[tuple[WorkflowEnvironment, int]]:
    """The dev server with the project's tuning and search attributes, and its pid (for CPU accounting);
    its output goes to data_dir/temporal.log. SQLite in memory, or in data_dir/temporal.db with `db_file`."""
    before = set(_my_children())
    with _output_to(data_dir / "temporal.log"):  # the dev server inherits our stdout and stderr
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(),
            dev_server_extra_args=FAST_STEP_FLAGS,
            dev_server_database_filename=str(data_dir / "temporal.db") if db_file else None,
            search_attributes=search_attributes.ALL,
            data_converter=pydantic_data_converter,
        )
    try:
        yield env, next(pid for pid, name in _my_children().items() if pid not in before and "temporal" in name)
    finally:
        await env.shutdown()


@contextlib.asynccontextmanager
async def services(
    data_dir: Path,
    *,
    slots: int,
    worker: str,
    db_file: bool,
    policy_args: tuple[str, ...] = (),
    worker_env: dict[str, str] | None = None,
) -> AsyncIterator[Stack]:
    """`worker` is `process` (`python worker.py`), `inproc` (the same worker in this process) or
    `none` (the caller starts its own). `policy_args` go to the demo policy's command line
    (e.g. `--delay-s 2`); `worker_env` adds ROLLOUTS_* variables to the worker process (settings
    under test)."""
    async with contextlib.AsyncExitStack() as stack:
        port = free_port()
        policy = _spawn(
            [sys.executable, "-m", "temporal_rollouts.policy_servers.demo", "--port", str(port), *policy_args],
            data_dir / "policy.log",
        )
        stack.callback(_stop, policy)
        await asyncio.to_thread(wait_for_port, "127.0.0.1", port, policy, "demo policy", data_dir / "policy.log")

        backend = LocalBackend(data_dir, SandboxSettings(slots_per_container=slots))
        container = await backend.start_container()
        stack.push_async_callback(backend.stop_container, container.container_id)

        env, server_pid = await stack.enter_async_context(temporal_dev_server(data_dir, db_file=db_file))

        settings = Settings(
            data_dir=data_dir,
            temporal={"address": env.client.service_client.config.target_host, "task_queue": TASK_QUEUE},
            demo_policy={"port": port, "start_local": False},
            sandbox={"slots_per_container": slots, "start_local": False},
            worker={"graceful_shutdown_s": 2.0, "metrics_address": f"127.0.0.1:{free_port()}"},
        )
        pool = SandboxPool.from_settings(settings)  # start_local off: it uses the container started above
        stack.push_async_callback(pool.aclose)
        await pool.fleet.ensure_running()
        pids = {"policy": policy.pid, "sandbox": container.pid or 0, "temporal": server_pid}

        if worker == "process":
            pids["worker"] = await worker_process(stack, settings, data_dir / "worker.log", worker_env)
        elif worker == "inproc":  # exactly what `python worker.py` runs, in this process
            from temporal_rollouts.runtime.worker import running_worker

            await stack.enter_async_context(running_worker(settings))
        yield Stack(settings, env.client, pool, pids)


async def worker_process(
    stack: contextlib.AsyncExitStack,
    settings: Settings,
    log_path: Path,
    worker_env: dict[str, str] | None = None,
    tree: Path | None = None,
) -> int:
    """`python worker.py` of the checkout at `tree` (this one by default) for `settings`, with
    `worker_env` added, stopped when `stack` closes; its pid once it polls."""
    env = {**_env_vars(settings), **(worker_env or {})}
    if tree is not None:  # that checkout's modules, not this one's
        env["PYTHONPATH"] = str(tree)
    proc = _spawn([sys.executable, str((tree or REPO) / "worker.py")], log_path, env=env)
    stack.callback(_stop, proc)
    await _wait_for_line(log_path, "worker polling", proc)
    return proc.pid
