"""A harness running in its slot as the agent: its process, its model endpoint, how it ended.

The harness is one long-lived command in the slot's sandbox, started through the same launch
path as every command (`isolation.start_sandboxed`), so it has the slot's uid, limits, network
policy and syscall filter; the commands it runs are its children there. Besides the workspace it
sees, read-only, `/run/rollouts` (its endpoint's socket, its task, the relay) and its bundle in
the cache. A wrapper starts the relay (`relay.py`) on a loopback port of the slot's own network
and sets `OPENAI_BASE_URL` to it before it runs the harness's command; a slot without python3
still has the socket (`ROLLOUTS_MODEL_SOCKET`). The harness's stdout and stderr are read all
the time, and their ends kept for the rollout's record.

A harness ends when it exits, when the rollout stops it, or when its slot is released or reset.
It lives in this server, not in the worker: a worker that dies does not touch it. A server that
dies takes it along (bubblewrap dies with its parent), and the rollout fails with `sandbox_error`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from temporal_rollouts.sandbox_server.harness.endpoint import ModelEndpoint
from temporal_rollouts.sandbox_server.isolation.bubblewrap import SlotSandbox, isolation_mode, start_sandboxed
from temporal_rollouts.sandbox_server.limits.confinement import Confinement
from temporal_rollouts.sandbox_server.schema import HarnessExit, HarnessStartRequest, HarnessState

RUN_DIR = "/run/rollouts"
"""Where the harness sees its endpoint's socket, its task and the relay."""
CACHE_DIR = "/cache"
HARNESS_PART = "harness"
"""The harness's own cgroup under the slot's: a one-shot command of the slot (a hook's) never ends it."""
RELAY = Path(__file__).with_name("relay.py")
READ_CHUNK = 64 * 1024
WRAPPER = """\
exec 3< <(exec python3 -I -S {run}/relay.py {run}/model.sock 2>/dev/null)
if read -r -t 10 port <&3; then
  export OPENAI_BASE_URL="http://127.0.0.1:$port/v1" OPENAI_API_BASE="http://127.0.0.1:$port/v1"
fi
exec 3<&-
{command}
"""


@dataclass
class SlotHarness:
    harness_id: str
    lease_id: str
    folder: Path
    endpoint: ModelEndpoint
    process: asyncio.subprocess.Process
    tail_chars: int
    confinement: Confinement | None
    slot: int
    stdout: bytearray = field(default_factory=bytearray)
    stderr: bytearray = field(default_factory=bytearray)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    stopped: bool = False
    pumps: list[asyncio.Task[None]] = field(default_factory=list)
    watching: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    @property
    def running(self) -> bool:
        return not self.ended.is_set()

    def exit(self) -> HarnessExit | None:
        if self.running:
            return None
        return HarnessExit(
            exit_code=self.process.returncode,
            stopped=self.stopped,
            stdout_tail=_tail(self.stdout, self.tail_chars),
            stderr_tail=_tail(self.stderr, self.tail_chars),
        )

    def state(self, started: bool = False) -> HarnessState:
        return HarnessState(harness_id=self.harness_id, started=started, running=self.running, exit=self.exit())


async def start_harness(
    request: HarnessStartRequest,
    *,
    folder: Path,
    sandbox: SlotSandbox,
    bundle: Path | None,
) -> SlotHarness:
    """Start the harness `request` names in the slot, its endpoint first, in `sandbox` (the lease's, taken
    whole, as every command of the slot); `folder`: the server's own folder for it (bound into the slot
    read-only), never in the slot's volume."""
    confinement = sandbox.confinement
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    os.chmod(folder, 0o755)
    shutil.copyfile(RELAY, folder / "relay.py")
    (folder / "task.md").write_text(request.task, encoding="utf-8")
    for name in ("relay.py", "task.md"):
        os.chmod(folder / name, 0o644)
    key = secrets.token_urlsafe(32)
    endpoint = ModelEndpoint(folder / "model.sock", key, request.model)
    await endpoint.start()
    isolated = isolation_mode(sandbox.require_isolation) == "bubblewrap"
    run = RUN_DIR if isolated else str(folder)  # unisolated, nothing is bound: the command sees the host's paths
    environment = {
        **request.env,
        "HOME": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
        "OPENAI_API_KEY": key,
        "ROLLOUTS_MODEL": request.model,
        "ROLLOUTS_MODEL_SOCKET": f"{run}/model.sock",
        "ROLLOUTS_TASK_FILE": f"{run}/task.md",
    }
    if bundle is not None:
        home = f"{CACHE_DIR}/{bundle.name}" if isolated else str(bundle)
        environment |= {"ROLLOUTS_HARNESS_HOME": home, "PYTHONPATH": home, "PATH_PREFIX": f"{home}/bin"}
    try:
        process = await start_sandboxed(
            ["bash", "-c", WRAPPER.format(run=run, command=_with_path(request.command, bundle is not None))],
            sandbox,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cache=[bundle] if bundle is not None else [],
            part=HARNESS_PART,
            filtered=True,
            binds=[(folder, RUN_DIR)] if isolated else [],
            environment=environment,
        )
    except BaseException:
        await endpoint.close()
        raise
    harness = SlotHarness(
        harness_id=request.harness_id,
        lease_id=request.lease_id,
        folder=folder,
        endpoint=endpoint,
        process=process,
        tail_chars=request.tail_chars,
        confinement=confinement,
        slot=sandbox.slot,
    )
    if confinement is not None:
        harness.watching.enter_context(confinement.watched(sandbox.slot, process.pid))
    assert process.stdout is not None and process.stderr is not None
    harness.pumps = [
        asyncio.create_task(_pump(process.stdout, harness.stdout, 4 * harness.tail_chars + READ_CHUNK)),
        asyncio.create_task(_pump(process.stderr, harness.stderr, 4 * harness.tail_chars + READ_CHUNK)),
    ]
    harness.pumps.append(asyncio.create_task(_watch_exit(harness)))
    return harness


async def stop_harness(harness: SlotHarness) -> None:
    """End the harness and everything it started; idempotent."""
    if harness.running:
        harness.stopped = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(harness.process.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            await harness.process.wait()
    await harness.ended.wait()
    harness.watching.close()
    if harness.confinement is not None:
        await asyncio.to_thread(harness.confinement.end_part, harness.slot, HARNESS_PART)
    await harness.endpoint.close()
    shutil.rmtree(harness.folder, ignore_errors=True)


def _with_path(command: str, bundled: bool) -> str:
    return f'export PATH="$PATH_PREFIX:$PATH"; unset PATH_PREFIX\n{command}' if bundled else command


async def _pump(stream: asyncio.StreamReader, into: bytearray, keep: int) -> None:
    while chunk := await stream.read(READ_CHUNK):
        into += chunk
        if len(into) > keep:
            del into[: len(into) - keep]


async def _watch_exit(harness: SlotHarness) -> None:
    await harness.process.wait()
    await asyncio.wait(harness.pumps[:2], timeout=2.0)  # what it printed last
    harness.ended.set()


def _tail(data: bytearray, chars: int) -> str:
    text = data.decode("utf-8", errors="replace")
    return text[-chars:] if chars else ""
