"""A hostile agent against the terminal_tasks checks, on a real sandbox server with bubblewrap.

A one-shot check runs in its own sandbox, but the agent's stateful terminal (and anything it left
running there) shares the workspace, and the agent's programs that a check runs share the check's
uid and sandbox. So: no agent process may run while a one-shot check does, and a check during
which the workspace changed does not pass. A check typed into the agent's own shell can still be
forged; that test documents the hole until the sandbox server can run a fresh process beside
the session (see envs/terminal_tasks/README.md)."""

from __future__ import annotations

import asyncio

import os
import shlex
import shutil
import subprocess
import uuid

import pytest

from envs import get_env
from envs.terminal_tasks.env import TerminalTasksEnv
from envs.terminal_tasks.loader import bundled_tasks
from envs.terminal_tasks.model import TerminalTask
from temporal_rollouts.core.tasks import Item, Verdict
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotLease
from tests.support.sandbox import holder, needs_bubblewrap, ONE_CONTAINER, workspace_of

pytestmark = [pytest.mark.slow, needs_bubblewrap]

ORIGINAL_MAIN = bundled_tasks()["fix-import-error"].files["main.py"]
SELF_RESTORING_MAIN = f'''\
"""Multiply two integers given on the command line."""
import sys
from pathlib import Path

a, b = (int(arg) for arg in sys.argv[1:3])
print(a * b)
if sys.argv[1:3] not in (["6", "7"], ["-3", "5"]):  # the check's third run: look untouched from now on
    Path(__file__).write_text({ORIGINAL_MAIN!r})
'''
"""main.py computing the product itself (calc stays broken), then putting its original text back."""
RESTORED_ONCE_READ = f'''\
"""Multiply two integers given on the command line."""
import ctypes, os, sys

a, b = (int(arg) for arg in sys.argv[1:3])
print(a * b, flush=True)
if sys.argv[1:3] not in (["6", "7"], ["-3", "5"]) and os.fork() == 0:  # the check's third run
    edited = open(__file__).read()
    libc = ctypes.CDLL(None, use_errno=True)
    watch = libc.inotify_init()
    open(__file__, "w").write({ORIGINAL_MAIN!r})  # what the check's last step reads ...
    libc.inotify_add_watch(watch, __file__.encode(), 0x10)  # IN_CLOSE_NOWRITE
    for fd in (0, 1, 2):
        os.close(fd)
    os.read(watch, 4096)
    open(__file__, "w").write(edited)  # ... and, once that read is done, the edit again for the fingerprint
    os._exit(0)
'''
"""main.py computing the product, whose child shows the check's read of main.py the original text
and writes the edit back the moment that read is done (inotify), so both fingerprints agree."""
BLINDED_MAIN = f'''\
"""Multiply two integers given on the command line."""
import ctypes, os, sys

a, b = (int(arg) for arg in sys.argv[1:3])
print(a * b, flush=True)
if sys.argv[1:3] not in (["6", "7"], ["-3", "5"]):  # the check's third run
    open(__file__, "w").write({ORIGINAL_MAIN!r})
    os.chmod("/workspace", 0o755)  # the check's next step imports calc from it
    if os.fork() == 0:
        libc = ctypes.CDLL(None, use_errno=True)
        watch = libc.inotify_init()
        libc.inotify_add_watch(watch, __file__.encode(), 0x10)  # IN_CLOSE_NOWRITE
        for fd in (0, 1, 2):
            os.close(fd)
        os.read(watch, 4096)
        os.chmod("/workspace", 0o300)  # blind again once the check read main.py
        os._exit(0)
'''
"""A self-restoring main.py (which the fingerprints alone catch) in a workspace left at mode 0300:
both fingerprints could not list it, and so agreed."""


def slot_of(pool: SandboxPool, lease: SlotLease, name: str, meta: dict | None = None) -> LeasedSlot:
    return LeasedSlot(pool, lease, f"{uuid.uuid4().hex[:8]}/{name}", meta=meta)


async def play(
    backend: LocalBackend, env: TerminalTasksEnv, task_id: str, commands: list[str], stateful: list[str] = ()
) -> Verdict:
    """Set up the task in a fresh slot, run the agent's one-shot then stateful commands, verify."""
    item = Item(id=task_id)
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        lease = await pool.acquire(holder("terminal-attack"), ttl_s=600, wait_s=60)
        try:
            meta = await env.setup_workspace(item, slot_of(pool, lease, "setup"))
            agent = slot_of(pool, lease, "agent")
            for command in commands:
                done = await agent.terminal(command)
                assert done.ok, (command, done.output)
            for command in stateful:
                done = await agent.terminal_stateful(command, timeout=30)
                assert done.ok, (command, done.output)
            return await env.verify(item, slot_of(pool, lease, "verify", meta=meta), [])
        finally:
            await pool.release(lease)


def terminal_env() -> TerminalTasksEnv:
    env = get_env("terminal_tasks")
    assert isinstance(env, TerminalTasksEnv)
    return env


async def test_a_program_the_check_runs_cannot_rewrite_what_the_check_reads_next(backend: LocalBackend) -> None:
    write = f"printf %s {shlex.quote(SELF_RESTORING_MAIN)} > main.py"
    verdict = await play(backend, terminal_env(), "fix-import-error", [write])
    assert verdict.score == 0.0, verdict.details


async def test_a_program_the_check_runs_cannot_restore_a_file_once_the_check_read_it(backend: LocalBackend) -> None:
    """The check reads main.py only after running it: a child of main.py shows that read the original
    text and puts the edit back before the fingerprint after the check. The check's workspace is
    read-only, so the child cannot write at all."""
    write = f"printf %s {shlex.quote(RESTORED_ONCE_READ)} > main.py"
    verdict = await play(backend, terminal_env(), "fix-import-error", [write])
    assert verdict.score == 0.0, verdict.details


async def test_a_workspace_the_agent_made_unlistable_fails_the_check(backend: LocalBackend) -> None:
    """`chmod 0300 /workspace` made the fingerprint's listing fail the same way before and after the
    check, so the "workspace changed" defence saw two equal fingerprints whatever changed between them.
    A fingerprint that cannot see everything now fails the check."""
    edit = f"printf %s {shlex.quote(BLINDED_MAIN)} > main.py"
    verdict = await play(backend, terminal_env(), "fix-import-error", [edit, "chmod 0300 /workspace"])
    assert verdict.score == 0.0, verdict.details
    assert "cannot list the workspace" in verdict.details.get("fingerprint_failed", ""), verdict.details


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs slots with uids of their own")
async def test_every_process_of_the_slots_uid_is_stopped_before_a_check(backend: LocalBackend) -> None:
    """A process of the slot's uid that no sandbox of the slot holds (started here on the host, as one
    that escaped its sandbox would run) keeps writing to the workspace; the check passes only if it
    still writes while the check runs."""
    env = terminal_env()
    grows = 'a=$(wc -c < tick); sleep 2; b=$(wc -c < tick); [ "$a" != "$b" ]\n'
    probe = TerminalTask(id="probe", prompt="keep ticking", check=grows, solution=())
    env.tasks = lambda: {"probe": probe}  # type: ignore[method-assign]
    item = Item(id="probe")
    async with SandboxPool(backend, ONE_CONTAINER) as pool:
        lease = await pool.acquire(holder("terminal-attack"), ttl_s=600, wait_s=60)
        tick = workspace_of(backend, lease.container_id, lease.slot) / "tick"
        uid = str(tick.parent.stat().st_uid)
        drop = ["setpriv", "--reuid", uid, "--regid", uid, "--clear-groups", "--"]
        with tick.open("ab") as out:  # its uid cannot reach the host's path to the workspace: it writes through this
            loop = "while :; do echo tick; sleep 0.1; done"
            ticker = subprocess.Popen([*drop, "bash", "-c", loop], stdout=out, start_new_session=True)
        try:
            for _ in range(200):  # it runs as the slot's uid once it ticks (a loaded host may take a while)
                if tick.stat().st_size:
                    break
                await asyncio.sleep(0.05)
            meta = await env.setup_workspace(item, slot_of(pool, lease, "setup"))
            verdict = await env.verify(item, slot_of(pool, lease, "verify", meta=meta), [])
            stopped = ticker.poll()
        finally:
            if ticker.poll() is None:
                os.killpg(ticker.pid, 9)
            ticker.wait()
            await pool.release(lease)
    assert stopped == -9, "the slot's stop killed it before the check"
    assert verdict.score == 0.0, verdict.details


async def test_no_agent_process_runs_while_a_one_shot_check_does(backend: LocalBackend) -> None:
    """A check that passes only if something keeps writing to the workspace while it runs."""
    env = terminal_env()
    grows = 'a=$(wc -c < tick); sleep 2; b=$(wc -c < tick); [ "$a" != "$b" ]\n'
    probe = TerminalTask(id="probe", prompt="keep ticking", check=grows, solution=())
    env.tasks = lambda: {"probe": probe}  # type: ignore[method-assign]
    ticker = "nohup bash -c 'while true; do echo tick >> /workspace/tick; sleep 0.1; done' >/dev/null 2>&1 &"
    verdict = await play(backend, env, "probe", [], stateful=[ticker, "sleep 0.5"])
    assert verdict.score == 0.0, verdict.details


async def test_an_honest_solution_still_passes(backend: LocalBackend) -> None:
    """fix-import-error fixed and tried as the reference solution does, with a stateful terminal left open."""
    fix = "printf '\\n\\nmultiply = mul\\n' >> calc/ops.py && python3 main.py 6 7"
    verdict = await play(backend, terminal_env(), "fix-import-error", [fix], stateful=["cd /workspace/calc"])
    assert verdict.score == 1.0, verdict.details


@pytest.mark.xfail(
    strict=True,
    raises=AssertionError,
    reason="a check typed into the agent's own shell runs whatever that shell makes of it; fixing it needs the "
    "sandbox server to start a fresh process in the session's network namespace",
)
async def test_a_check_in_the_agents_shell_cannot_be_forged(backend: LocalBackend) -> None:
    shadow = "command() { echo OK; return 0; }; unset() { :; }; unalias() { :; }"
    verdict = await play(backend, terminal_env(), "serve-status-page", [], stateful=[shadow])
    assert verdict.score == 0.0, verdict.details
