"""Issue #28: an agent's one-shot commands forked from a launcher resident in the slot's sandbox.

Against a real root-run sandbox server under bubblewrap with cgroups (LocalBackend, as the
worker starts it). A resident command must behave as one in a sandbox of its own, keep every
limit, leave nothing running, never run twice, and never reach its launcher or the verifier.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.config import ServerOptions, SlotLimits
from temporal_rollouts.sandbox_server.schema import AcquireRequest, ExecOp, SearchOp, SessionOp, SlotLease, ToolOutput
from tests.support.sandbox import sandbox_settings
from tests.support.processes import command_lines
from tests.support.sandbox import (
    execute_in,
    fork_bomb,
    holder,
    needs_bubblewrap,
    processes_running,
    release_of,
    running_container,
    unique_sleep,
    wait_until,
)

pytestmark = [
    needs_bubblewrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="slot uids and cgroups need root"),
    pytest.mark.host_lock("slot-uids-62000"),  # slot_processes: every process of the range
]

UID_BASE = 62000
SERVER = ServerOptions(
    slot_uid_base=UID_BASE,
    slot_uid_count=64,
    limits=SlotLimits(memory_limit_mb=256, max_processes=64, tmp_limit_mb=16, disk_limit_mb=100, cpu_time_limit_s=60),
)
PID_1 = "ps -o comm= -p 1"
LAUNCHER_START = "cut -d' ' -f22 /proc/1/stat"
"""The sandbox's pid 1's start time: the same launcher answers while it stays the same."""


@pytest.fixture(scope="module", params=["cgroups", "rlimits"])
async def client(request, tmp_path_factory):
    """A server with cgroups, and one told not to use them (what most containers give a server)."""
    options = SERVER.model_copy(update={"use_cgroups": request.param == "cgroups"})
    backend = LocalBackend(
        tmp_path_factory.mktemp("resident"), sandbox_settings(options, slots_per_container=2, sweep_interval_s=0.3)
    )
    async with running_container(backend) as (_, client):
        health = await client.send(HealthQuery())
        if request.param == "cgroups" and not health.limits["processes"].startswith("cgroup"):
            pytest.skip("no cgroups here")
        client.cgroups = request.param == "cgroups"
        yield client


@pytest.fixture
async def lease(client):
    taken = await client.send(AcquireRequest(holder=holder("resident"), ttl_s=120, wait_s=30))
    yield taken
    await client.send(release_of(taken))


async def run(
    client: SandboxClient, lease: SlotLease, command: str, *, resident: bool = True, timeout_s: float = 30.0
) -> ToolOutput:
    operation = ExecOp(command=command, timeout_s=timeout_s, resident=resident)
    return await client.send(execute_in(lease, uuid.uuid4().hex, operation))


def slot_processes() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
            except OSError:
                continue
            if UID_BASE <= uid < UID_BASE + 64:
                found.append(int(entry.name))
    return found


SAME_EITHER_WAY = [
    "echo out; echo err >&2; exit 3",
    "yes | head -2",  # SIGPIPE is the default again, though Python ignores it
    'read -r line; echo "[$line] $?"',
    "id; pwd; umask; ulimit -f; ulimit -c",
    "env | sort",
    "ls /proc/self/fd",  # 0-2 and ls's own: nothing of the launcher's or the server's
    "touch /usr/x 2>&1; cat /etc/shadow 2>&1 | head -1",
    "exec sh -c 'kill -TERM $$'",
]


@pytest.mark.parametrize("command", SAME_EITHER_WAY)
async def test_a_resident_command_answers_as_one_in_a_sandbox_of_its_own(client, lease, command):
    own = await run(client, lease, command, resident=False)
    resident = await run(client, lease, command)
    assert (resident.output, resident.exit_code, resident.ok) == (own.output, own.exit_code, own.ok)
    assert (await run(client, lease, PID_1)).output.startswith("python3")
    assert (await run(client, lease, PID_1, resident=False)).output == "bwrap\n"


async def test_ps_names_the_launcher_and_its_slot_instead_of_printing_its_source(client, lease):
    """`python -c SOURCE` put the launcher's 250 lines on every `ps` line of every slot's launcher."""
    assert (await run(client, lease, "true")).ok  # the lease's launcher runs from here on
    inside = (await run(client, lease, "tr '\\0' ' ' < /proc/1/cmdline")).output
    assert f"rollouts-slot-launcher slot={lease.slot} " in inside and len(inside) < 120, inside
    on_host = [line for line in command_lines().values() if "rollouts-slot-launcher" in line]
    assert on_host and not [line for line in on_host if "import " in line or "def " in line], on_host


async def test_the_command_runs_in_its_own_part_of_the_slots_cgroups(client, lease):
    if not client.cgroups:
        pytest.skip("no cgroups")
    placed = await run(client, lease, "grep -E ':(pids|memory):' /proc/self/cgroup")
    assert placed.output.count(":/../resident\n") == 2, placed.output  # beside the launcher's own part


async def test_the_agents_searches_run_from_its_launcher_and_a_hooks_never_do(client, lease):
    """The agent's search runs where its terminal calls run (no sandbox of its own per search), which the
    lease's /tmp shows through a link the agent made; a hook's search still never sees that /tmp."""
    assert (await run(client, lease, "echo needle > /tmp/planted.txt && ln -s /tmp tmplink")).ok
    agents = SearchOp(pattern="needle", path="tmplink", resident=True)
    found = await client.send(execute_in(lease, uuid.uuid4().hex, agents))
    assert found.ok and found.output == "tmplink/planted.txt:1:needle", found.output
    hooks = await client.send(execute_in(lease, uuid.uuid4().hex, SearchOp(pattern="needle", path="tmplink")))
    assert hooks.ok and hooks.output == "no matches", hooks.output


async def test_tmp_lasts_for_the_lease_and_never_reaches_a_hook_or_the_next_lease(client):
    first = await client.send(AcquireRequest(holder=holder("tmp"), ttl_s=120, wait_s=30))
    assert (await run(client, first, "echo planted > /tmp/conftest.py")).ok
    assert (await run(client, first, "cat /tmp/conftest.py")).output == "planted\n"
    hook = await run(client, first, "cat /tmp/conftest.py", resident=False)
    assert not hook.ok and "No such file" in hook.output
    await client.send(release_of(first))
    assert await wait_until(lambda: not slot_processes(), timeout_s=10), slot_processes()
    leases = [await client.send(AcquireRequest(holder=holder("tmp"), ttl_s=120, wait_s=30)) for _ in range(2)]
    try:
        for later in leases:
            assert "No such file" in (await run(client, later, "cat /tmp/conftest.py")).output
    finally:
        for later in leases:
            await client.send(release_of(later))


async def test_nothing_a_resident_command_starts_outlives_it(client, lease):
    launcher = (await run(client, lease, LAUNCHER_START)).output
    background, daemon, hung = unique_sleep(), unique_sleep(), unique_sleep()
    started = await run(client, lease, f"sleep {background} & setsid nohup sleep {daemon} >/dev/null 2>&1 & echo go")
    assert started.output == "go\n"
    timed_out = await run(client, lease, f"(sleep {hung} &) ; sleep {hung}", timeout_s=1)
    assert timed_out.timed_out
    for marker in (background, daemon, hung):
        assert await wait_until(lambda m=marker: not processes_running(m), timeout_s=5), marker
    assert (await run(client, lease, LAUNCHER_START)).output == launcher, "the launcher was replaced"


async def test_a_command_can_neither_kill_nor_trace_nor_read_its_launcher(client, lease):
    launcher = (await run(client, lease, LAUNCHER_START)).output
    signals = await run(client, lease, "for s in KILL TERM INT HUP STOP; do kill -$s 1; done; echo sent")
    assert signals.output.endswith("sent\n")
    assert (await run(client, lease, LAUNCHER_START)).output == launcher
    reads = await run(client, lease, "for f in environ maps mem; do head -c 64 /proc/1/$f; echo; done; ls /proc/1/fd")
    assert reads.output.count("Permission denied") == 4, reads.output
    trace = await run(
        client,
        lease,
        "python3 -c 'import ctypes; c = ctypes.CDLL(None, use_errno=True); "
        "print(c.ptrace(16, 1, 0, 0), ctypes.get_errno())'",  # PTRACE_ATTACH to the launcher
    )
    assert trace.output == "-1 1\n", trace.output  # EPERM
    assert (await run(client, lease, "echo still")).output == "still\n"


async def test_a_resident_fork_bomb_is_capped_and_the_next_command_runs(client, lease):
    marker = unique_sleep()
    result = await run(client, lease, f"python3 - <<'PY'\n{fork_bomb(marker)}PY", timeout_s=60)
    assert "stopped after" in result.output and int(result.output.split("forked")[-1].split()[0]) < 64
    assert await wait_until(lambda: not processes_running(marker), timeout_s=10)
    assert (await run(client, lease, "echo alive")).output == "alive\n"


async def test_a_launcher_killed_from_outside_runs_no_command_twice(client, lease):
    assert (await run(client, lease, "echo one >> count")).ok
    launchers = [
        pid for pid in slot_processes() if b"rollouts-slot-launcher" in Path(f"/proc/{pid}/cmdline").read_bytes()
    ]
    assert len(launchers) == 1
    os.kill(launchers[0], signal.SIGKILL)
    after = await run(client, lease, "echo two >> count; cat count")
    assert after.output == "one\ntwo\n" and after.ok
    assert (await run(client, lease, PID_1)).output.startswith("python3"), "no new launcher"


async def test_the_stateful_terminal_outlives_resident_commands(client, lease):
    marker = unique_sleep()
    session = SessionOp(action="run", text=f"sleep {marker} & echo started")
    assert (await client.send(execute_in(lease, "s1", session))).output.endswith("started\n")
    for i in range(3):
        assert (await run(client, lease, f"echo {i}")).ok
    jobs = await client.send(execute_in(lease, "s2", SessionOp(action="run", text="jobs -r | wc -l")))
    assert jobs.output.strip() == "1"
    assert len(processes_running(marker)) == 1


@pytest.mark.slow
async def test_hundreds_of_quick_commands_each_get_their_own_status(client, lease):
    """A status reaped between the command's start and the launcher's wait was once lost, and the
    command hung until its timeout. Quick commands in a row on a host whose cores are busy make that
    window likely (the old launcher failed this within seconds; idle, it mostly passed)."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(os.cpu_count() or 2)]
    try:
        for i in range(300):
            result = await run(client, lease, f"exit {i % 7}", timeout_s=10)
            assert result.exit_code == i % 7 and not result.timed_out, (i, result)
    finally:
        for process in busy:
            process.kill()
            process.wait()
