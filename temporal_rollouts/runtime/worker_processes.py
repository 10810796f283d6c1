"""More worker processes on one machine (`worker.processes`), so a worker uses every core.

A Python worker runs its workflow code and its activities on one event loop, so one process
uses about one core. `python worker.py` with `worker.processes = N` stays the first process
(it starts the local services: the embedded server, the demo policy, the sandbox containers)
and runs N - 1 more `python worker.py` processes beside it. They poll the same task queue
with the same settings; they are told the first one's Temporal address, so they start no
services of their own. One that dies is started again; on SIGTERM or Ctrl-C each gets
SIGTERM and drains as the first does (`worker.graceful_shutdown_s`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys

from temporal_rollouts.core.settings import Settings

log = logging.getLogger(__name__)

RESTART_PAUSE_S = 2.0
STOP_MARGIN_S = 10.0


def metrics_address_of(address: str, process: int) -> str:
    """Where worker process `process` (1 is `python worker.py` itself) serves its metrics, when
    `worker.metrics_address` is `address`: each process on its own port, counting up from it."""
    host, _, port = address.rpartition(":")
    return f"{host}:{int(port) + process - 1}"


class WorkerProcesses:
    def __init__(self, settings: Settings, count: int, command: list[str]) -> None:
        """`command`: the worker script and its flags, run with this interpreter."""
        self._settings = settings
        self._count = count
        self._argv = [sys.executable, *command]
        self._running: dict[int, asyncio.subprocess.Process] = {}

    def _env(self, index: int) -> dict[str, str]:
        env = {
            **os.environ,
            "ROLLOUTS_TEMPORAL__ADDRESS": self._settings.temporal_address,  # the embedded server's, when embedded
            "ROLLOUTS_WORKER__PROCESSES": "1",
            "ROLLOUTS_DEMO_POLICY__START_LOCAL": "false",
        }
        if self._settings.worker.metrics_address is not None:  # process index + 2: the first is this one
            env["ROLLOUTS_WORKER__METRICS_ADDRESS"] = metrics_address_of(
                self._settings.worker.metrics_address, index + 2
            )
        return env

    async def _start(self, index: int) -> None:
        process = await asyncio.create_subprocess_exec(
            *self._argv, env=self._env(index), stdin=asyncio.subprocess.DEVNULL
        )
        self._running[index] = process
        log.info("worker process %d of %d started (pid %d)", index + 2, self._count + 1, process.pid)

    async def run(self, stop: asyncio.Event) -> None:
        """Keep `count` processes running until `stop` is set, then stop them."""
        try:
            for index in range(self._count):
                await self._start(index)
            while not stop.is_set():
                exits = {asyncio.ensure_future(p.wait()): i for i, p in self._running.items()}
                stopping = asyncio.ensure_future(stop.wait())
                done, _ = await asyncio.wait({*exits, stopping}, return_when=asyncio.FIRST_COMPLETED)
                for task in exits:
                    task.cancel()
                stopping.cancel()
                for task in done & exits.keys():
                    index = exits[task]
                    log.warning("worker process %d exited with %s; starting it again", index + 2, task.result())
                    await asyncio.sleep(RESTART_PAUSE_S)
                    if not stop.is_set():
                        await self._start(index)
        finally:
            await self._stop_all()

    async def _stop_all(self) -> None:
        for process in self._running.values():
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        waits = [process.wait() for process in self._running.values()]
        try:
            await asyncio.wait_for(asyncio.gather(*waits), self._settings.worker.graceful_shutdown_s + STOP_MARGIN_S)
        except TimeoutError:
            for process in self._running.values():
                if process.returncode is None:
                    process.kill()
