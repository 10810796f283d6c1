"""Issue #11: an agent cannot break out of, bring down, or game its sandbox.

Each test plays one reproduced break against a real sandbox server under bubblewrap
(started by LocalBackend, as the worker starts it) and then checks what must hold after
any break: other slots' commands still run, nothing the slot started is left running,
and the next holder of the slot finds an empty workspace.
"""

from __future__ import annotations

import asyncio
import io
import os
import re
import shlex
import signal
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

from envs.terminal_tasks import bundled_tasks
from envs.terminal_tasks.env import CHECK_PRELUDE
from temporal_rollouts.core.errors import BadToolRequest, SandboxRequired, SlotUnavailable
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.local import LocalBackend, server_environment
from temporal_rollouts.sandbox_server.config import ContainerConfig, ServerOptions, SlotLimits
from temporal_rollouts.sandbox.client import SandboxClient
from temporal_rollouts.sandbox.requests import HealthQuery, SlotsQuery
from temporal_rollouts.sandbox_server.isolation import bubblewrap
from temporal_rollouts.sandbox_server.schema import (
    AcquireRequest,
    ExecOp,
    NarrowRequest,
    ReadFileOp,
    SlotLease,
    SessionOp,
    SlotLimitsRequest,
    TransferQuery,
    TransferResult,
    WriteFileOp,
)
from temporal_rollouts.sandbox_server.slots.manager import SlotManager
from tests.support.sandbox import (
    sandbox_settings,
    execute_in,
    fork_bomb,
    holder,
    needs_bubblewrap,
    processes_running,
    release_of,
    running_container,
    unique_sleep,
    wait_until,
    workspace_of,
)

pytestmark = [needs_bubblewrap, pytest.mark.host_lock("slot-uids-61000")]  # _slot_processes: every process of the range

SLOTS = 3
UID_BASE, UID_COUNT = 61000, 64
SERVER = ServerOptions(
    slot_uid_base=UID_BASE,
    slot_uid_count=UID_COUNT,
    limits=SlotLimits(
        memory_limit_mb=256,
        max_processes=64,
        file_size_limit_mb=64,
        tmp_limit_mb=16,
        disk_limit_mb=100,
        cpu_time_limit_s=60,
    ),
)
NO_CGROUPS = SERVER.model_copy(update={"use_cgroups": False})
AS_ROOT = os.geteuid() == 0


@pytest.fixture(scope="module")
async def backend(tmp_path_factory) -> LocalBackend:
    return LocalBackend(
        tmp_path_factory.mktemp("hardening"), sandbox_settings(SERVER, slots_per_container=SLOTS, sweep_interval_s=0.3)
    )


@pytest.fixture(scope="module")
async def server(backend):
    os.environ["WORKER_API_KEY_FOR_TEST"] = "sk-must-not-leak"
    try:
        async with running_container(backend) as (info, client):
            yield info, client
    finally:
        os.environ.pop("WORKER_API_KEY_FOR_TEST", None)
        remove_deep(backend.directory)


def remove_deep(directory: Path) -> None:
    """Delete what the tests made with `rm -rf`: pytest's own clean-up of old temp folders recurses and
    would fail on a tree as deep as the ones these tests build."""
    subprocess.run(["rm", "-rf", "--", str(directory)], check=False)


class Slots:
    """Leases on the shared server, and the checks every break test ends with."""

    def __init__(self, backend: LocalBackend, info, client: SandboxClient) -> None:
        self.backend, self.info, self.client = backend, info, client
        self.taken: list[SlotLease] = []

    async def take(self, **options) -> SlotLease:
        lease = await self.client.send(AcquireRequest(holder=holder("hardening"), ttl_s=120, wait_s=30, **options))
        self.taken.append(lease)
        return lease

    async def run(self, lease: SlotLease, command: str, timeout_s: float = 60.0, resident: bool = False):
        operation = ExecOp(command=command, timeout_s=timeout_s, resident=resident)
        return await self.client.send(execute_in(lease, uuid.uuid4().hex, operation))

    def workspace(self, lease: SlotLease) -> Path:
        return workspace_of(self.backend, self.info.container_id, lease.slot)

    def uid(self, lease: SlotLease) -> int:
        """The uid the slot claimed on this host (its workspace is given to it), inside the range."""
        uid = self.workspace(lease).stat().st_uid
        assert UID_BASE <= uid < UID_BASE + UID_COUNT, uid
        return uid

    async def release_all(self) -> None:
        for lease in self.taken:
            await self.client.send(release_of(lease))
        self.taken.clear()

    async def after_break(self, marker: str | None = None) -> None:
        """Other slots still run commands, nothing is left running, every next holder sees an empty workspace."""
        await self.release_all()
        assert await wait_until(lambda: not _slot_processes(), timeout_s=15), _slot_processes()
        if marker is not None:
            assert processes_running(marker) == []
        health = await self.client.send(HealthQuery())
        assert health.quarantined == {}
        assert await _eventually_free(self.client, SLOTS)
        fresh = [await self.take() for _ in range(SLOTS)]
        for lease in fresh:
            listing = await self.run(lease, "id -u; ls -A /workspace | wc -l; echo alive")
            lines = listing.output.split()
            assert listing.ok and lines[-1] == "alive", listing.output
            assert lines[-2] == "0", f"slot {lease.slot} was handed on dirty: {listing.output}"
            if AS_ROOT:
                assert lines[0] == str(self.uid(lease))
        if AS_ROOT:
            assert len({self.uid(lease) for lease in fresh}) == SLOTS, "slots share a uid"
        await self.release_all()


@pytest.fixture
async def slots(backend, server):
    info, client = server
    taken = Slots(backend, info, client)
    yield taken
    await taken.release_all()


def _slot_processes() -> list[int]:
    """Pids owned by one of the slots' uids (only meaningful for a root-run server)."""
    if not AS_ROOT:
        return []
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                uid = entry.stat().st_uid
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                continue
            if UID_BASE <= uid < UID_BASE + UID_COUNT and state != "Z":
                found.append(int(entry.name))
    return found


async def _eventually_free(client: SandboxClient, count: int) -> bool:
    for _ in range(200):
        if (await client.send(HealthQuery())).free == count:
            return True
        await asyncio.sleep(0.1)
    return False


# --- 1. no host root from a slot --------------------------------------------------------


@pytest.mark.parametrize("resident", [False, True], ids=["own-sandbox", "resident"])
async def test_a_setuid_copy_never_gives_root(slots, resident):
    lease = await slots.take()
    result = await slots.run(
        lease,
        "id -u; cp /bin/bash rootshell; chmod 4755 rootshell; ./rootshell -p -c 'echo euid=$(id -u)'; "
        "grep ' /workspace ' /proc/self/mountinfo",
        resident=resident,
    )
    lines = result.output.splitlines()
    assert lines[0] != "0", result.output
    assert "euid=0" not in result.output and "euid=" in result.output
    # the agent's commands may not set the bit at all (syscall_filter); a hook's may, on a nosuid mount
    assert ("Operation not permitted" in result.output) == resident, result.output
    mount = next(line for line in lines if " /workspace " in line)
    assert "nosuid" in mount and "nodev" in mount
    copied = (slots.workspace(lease) / "rootshell").stat()
    assert copied.st_uid != 0, "a slot left a root-owned file on the host"
    assert not copied.st_mode & 0o6000, oct(copied.st_mode)
    if AS_ROOT:
        assert copied.st_uid == slots.uid(lease)
    await slots.after_break()


async def test_files_written_by_the_server_stay_editable_by_the_slot(slots):
    lease = await slots.take()
    write = WriteFileOp(path="deep/er/file.txt", content="from host\n")
    written = await slots.client.send(execute_in(lease, uuid.uuid4().hex, write))
    assert written.ok
    edited = await slots.run(lease, "echo more >> deep/er/file.txt && touch deep/er/new && cat deep/er/file.txt")
    assert edited.ok and edited.output == "from host\nmore\n"
    await slots.after_break()


# --- 2. resource limits ------------------------------------------------------------------


async def test_health_says_which_limits_are_in_force(slots):
    health = await slots.client.send(HealthQuery())
    assert health.require_isolation and health.isolation == "bubblewrap"
    for limit in ("memory", "processes", "cpu_time", "file_size", "tmp", "disk"):
        assert health.limits[limit] != "off", health.limits
    assert health.limits["setuid_bits"] == "refused-in-agent-sandboxes"
    assert health.network == "refused"


async def test_memory_is_capped_and_the_other_slots_keep_running(slots):
    hog, other = await slots.take(), await slots.take()
    hogging = asyncio.create_task(
        slots.run(hog, 'python3 -c \'x = bytearray(1 << 30); x[::4096] = b"y" * len(x[::4096]); print("GOT", 6 * 7)\'')
    )
    alive = await slots.run(other, "echo alive")
    result = await hogging
    assert "GOT 42" not in result.output and not result.ok, result.output
    assert alive.ok and alive.output == "alive\n"
    await slots.after_break()


async def test_a_fork_bomb_is_capped_and_leaves_nothing(slots):
    bomb, other = await slots.take(), await slots.take()
    marker = unique_sleep()
    result = await slots.run(bomb, f"python3 - <<'PY'\n{fork_bomb(marker)}PY", timeout_s=60)
    forked = int(result.output.split("forked")[-1].split()[0])
    assert "stopped after" in result.output and forked < 64, result.output
    assert (await slots.run(other, "echo alive")).output == "alive\n"
    await slots.after_break(marker)


async def test_one_shot_commands_leave_no_zombie_to_fill_the_slot(slots):
    """Each one left bubblewrap's init for the host's init to reap; here that came late enough that
    the 64-process slot refused to start its 65th command in a row. Now the server reaps it."""
    lease = await slots.take()
    for attempt in range(100):
        result = await slots.run(lease, "true")
        assert result.ok, (attempt, result.output)
    await slots.after_break()


@pytest.fixture(scope="module")
async def rlimit_server(tmp_path_factory):
    """A server told not to use cgroups: what a container without cgroup delegation gets."""
    backend = LocalBackend(
        tmp_path_factory.mktemp("rlimits"),
        sandbox_settings(NO_CGROUPS, slots_per_container=SLOTS, sweep_interval_s=0.3),
    )
    async with running_container(backend) as (info, client):
        yield backend, info, client


async def test_without_cgroups_rlimits_cap_memory_and_processes(rlimit_server):
    backend, info, client = rlimit_server
    slots = Slots(backend, info, client)
    health = await client.send(HealthQuery())
    assert health.limits["memory"].startswith("watchdog (slot total: ")
    assert health.limits["memory"].endswith(" + rlimit-as (each process)")
    assert "SysV shared memory" in health.not_held["memory"]
    assert health.limits["processes"].startswith("rlimit-nproc")
    hog, bomb = await slots.take(), await slots.take()
    memory = await slots.run(hog, "python3 -c 'x = bytearray(1 << 30); print(\"GOT\", 6 * 7)'")
    assert "GOT 42" not in memory.output and "MemoryError" in memory.output
    marker = unique_sleep()
    forks = await slots.run(bomb, f"python3 - <<'PY'\n{fork_bomb(marker)}PY", timeout_s=60)
    forked = int(forks.output.split("forked")[-1].split()[0])
    assert "stopped after" in forks.output and forked < 64, forks.output
    await slots.after_break(marker)


async def session_outlives_one_shot_commands(slots: Slots) -> None:
    lease = await slots.take()
    marker = unique_sleep()

    async def session(call_id: str, text: str):
        return await slots.client.send(execute_in(lease, call_id, SessionOp(action="run", text=text)))

    assert (await session("s1", f"sleep {marker} & echo started")).output.endswith("started\n")
    for i in range(3):
        assert (await slots.run(lease, f"echo one-shot {i}")).ok
    still = await session("s2", "jobs -r | wc -l")
    assert still.ok and still.output.strip() == "1", still.output
    assert len(processes_running(marker)) == 1
    await slots.after_break(marker)  # released: the session and its job end now


async def test_one_shot_commands_never_end_the_slots_session_under_cgroups(slots):
    """A one-shot command's cleanup kills its own part of the slot's cgroup, not the session's."""
    assert (await slots.client.send(HealthQuery())).limits["memory"].startswith("cgroup")
    await session_outlives_one_shot_commands(slots)


async def test_one_shot_commands_never_end_the_slots_session_without_cgroups(rlimit_server):
    await session_outlives_one_shot_commands(Slots(*rlimit_server))


SET_PRIVILEGE_BITS = (
    "cp /bin/true suid; chmod 4755 suid; mkdir sgid; chmod 2775 sgid; install -m 6755 /bin/true both; "
    "python3 -c 'import os; os.close(os.open(\"made\", os.O_CREAT | os.O_WRONLY, 0o4755))'; "
    "python3 -c 'import ctypes; ctypes.CDLL(None).syscall(452, -100, b\"suid\", 0o6755, 0)'; "  # fchmodat2
    "stat -c '%n %a' suid sgid both made"
)


async def test_the_agent_cannot_set_a_setuid_or_setgid_bit(slots):
    """Refused at the syscall (chmod, install, open with a mode, fchmodat2) from the resident launcher and
    in the stateful terminal, so the bits never reach the host's disk, not even while a command runs."""
    lease = await slots.take()
    made = await slots.run(lease, SET_PRIVILEGE_BITS, resident=True)
    assert made.output.count("Operation not permitted") >= 3, made.output
    assert {"suid 755", "sgid 755"} <= set(made.output.splitlines()), made.output
    session = await slots.client.send(
        execute_in(
            lease,
            uuid.uuid4().hex,
            SessionOp(action="run", text="cp /bin/true later; chmod u+s later; stat -c %a later"),
        )
    )
    assert "Operation not permitted" in session.output and "755" in session.output, session.output
    workspace = slots.workspace(lease)
    assert not (workspace / "made").exists()  # open with such a mode is refused before it creates anything
    for name in ("suid", "sgid", "both", "later"):
        assert not (workspace / name).lstat().st_mode & 0o6000, f"{name}: {oct((workspace / name).lstat().st_mode)}"
    assert (workspace / "suid").lstat().st_mode & 0o777 == 0o755  # the rest of the mode is kept
    await slots.after_break()


async def test_bits_a_hooks_command_sets_are_stripped_after_it(slots):
    """Hooks run without the filter (a verifier's tests behave as anywhere), so the walk strips after them."""
    lease = await slots.take()
    made = await slots.run(lease, SET_PRIVILEGE_BITS)
    assert {"suid 6755", "sgid 2775", "both 6755", "made 4755"} <= set(made.output.splitlines()), made.output
    workspace = slots.workspace(lease)
    for name in ("suid", "sgid", "both", "made"):
        assert not (workspace / name).lstat().st_mode & 0o6000, f"{name}: {oct((workspace / name).lstat().st_mode)}"
    assert (workspace / "suid").lstat().st_mode & 0o777 == 0o755  # the rest of the mode is kept
    await slots.after_break()


HOLD_150_MB = "python3 -c 'import time; x = bytearray(150 << 20); x[::4096] = b\"x\" * len(x[::4096]); time.sleep(30)'"


@pytest.mark.parametrize("resident", [False, True], ids=["own-sandbox", "resident"])
@pytest.mark.slow
async def test_without_cgroups_the_memory_limit_holds_for_the_slot_as_a_whole(rlimit_server, resident):
    """Each process is under the slot's 256 MB, four at once are not: the watchdog kills until they fit."""
    backend, info, client = rlimit_server
    slots = Slots(backend, info, client)
    lease = await slots.take()
    held = await slots.run(
        lease,
        f"for i in 1 2 3 4; do {HOLD_150_MB} & done; sleep 3; jobs -r | wc -l; wait; echo waited",
        timeout_s=60,
        resident=resident,
    )
    running_after_3s = int(held.output.split("waited")[0].split()[-1])
    assert running_after_3s <= 1, held.output
    assert "went over its memory limit of 256 MiB" in held.output
    await slots.after_break()


async def test_without_cgroups_a_slot_gets_no_more_than_its_cpu_share(rlimit_server):
    """--cpus 0.25 (narrowed for this lease): two seconds of a busy loop get about half a CPU-second."""
    backend, info, client = rlimit_server
    slots = Slots(backend, info, client)
    lease = await slots.take()
    await client.send(narrowing(lease, SlotLimitsRequest(cpus=0.25)))
    busy = "python3 -c 'import time; t = time.time()\nwhile time.time() - t < 2: pass\nprint(time.process_time())'"
    used = float((await slots.run(lease, busy, timeout_s=60)).output.split()[-1])
    assert used < 1.0, f"a 0.25-CPU slot used {used:.2f} CPU-s in 2 s"
    await slots.after_break()


async def test_files_tmp_and_workspace_are_size_capped(slots):
    lease = await slots.take()
    big_file = await slots.run(lease, "head -c 200M /dev/zero > big; ls -l big | awk '{print $5}'")
    assert int(big_file.output.split()[-1]) <= 64 * 1024 * 1024
    tmp = await slots.run(lease, "head -c 50M /dev/zero > /tmp/fill; echo rc=$?; df -k /tmp | tail -1")
    assert "No space left" in tmp.output and "rc=1" in tmp.output
    filled = await slots.run(lease, "rm -f big; for i in 1 2 3; do head -c 60M /dev/zero > f$i; done; echo done")
    assert not filled.ok and "disk limit" in filled.output
    refused = await slots.client.send(execute_in(lease, "w-over", WriteFileOp(path="x", content="x")))
    assert not refused.ok and "disk limit" in refused.output
    freed = await slots.run(lease, "rm -f f1 f2 f3")
    assert freed.ok
    await slots.after_break()


@pytest.mark.slow
async def test_a_timeout_kills_the_whole_tree_even_a_daemon(slots):
    lease = await slots.take()
    marker = unique_sleep()
    result = await slots.run(lease, f"setsid nohup sleep {marker} >/dev/null 2>&1 & sleep {marker}", timeout_s=1)
    assert result.timed_out
    await slots.after_break(marker)


# --- 3. graders cannot be steered by the workspace ---------------------------------------

SHADOWS = {
    # Module shadows on the import path and a user-site hook: each prints OK and exits 0.
    **{
        f"{name}.py": "import sys\nprint('OK')\nsys.exit(0)\n"
        for name in ("pathlib", "json", "tarfile", "sys", "os", "re", "fnmatch", "collections", "encodings")
    },
    ".local/lib/python3.11/site-packages/usercustomize.py": "import sys\nprint('OK')\nsys.exit(0)\n",
    ".local/lib/python3.12/site-packages/usercustomize.py": "import sys\nprint('OK')\nsys.exit(0)\n",
    ".local/lib/python3.11/site-packages/zz.pth": "import sys; print('OK'); sys.exit(0)\n",
    "sitecustomize.py": "import sys\nprint('OK')\nsys.exit(0)\n",
}


@pytest.mark.slow
async def test_no_bundled_task_check_passes_on_planted_modules(slots):
    """Before the fix, writing `pathlib.py` that prints OK scored 1.0 on 9 of 16 tasks. As a control,
    each task's reference solution still passes with the checker-side plants present."""
    lease = await slots.take()

    async def fresh_task(task, planted: dict[str, str], solve: bool) -> int | None:
        await slots.run(lease, "rm -rf ./* ./.[!.]*")
        for path, content in task.files.items():
            await write(path, content)
        if task.executable:
            await slots.run(lease, "chmod +x -- " + " ".join(shlex.quote(p) for p in task.executable))
        if solve:
            for turn in task.turns():
                for call in turn:
                    if call.name == "terminal":
                        await slots.run(lease, call.arguments["command"])
                    elif call.name == "write_file":
                        await write(call.arguments["path"], call.arguments["content"])
        for path, content in planted.items():
            await write(path, content)
        return (await slots.run(lease, CHECK_PRELUDE + task.check)).exit_code

    async def write(path: str, content: str) -> None:
        written = await slots.client.send(execute_in(lease, uuid.uuid4().hex, WriteFileOp(path=path, content=content)))
        assert written.ok, written.output

    gamed = [task.id for task in bundled_tasks().values() if await fresh_task(task, SHADOWS, solve=False) == 0]
    assert gamed == []
    checker_side = {path: content for path, content in SHADOWS.items() if not path.endswith(".py") or "/" in path}
    checker_side["pathlib.py"] = SHADOWS["pathlib.py"]
    one_shot = [task for task in bundled_tasks().values() if not task.check_in_session]  # (test_stateful_task)
    unsolved = [task.id for task in one_shot if await fresh_task(task, checker_side, solve=True) != 0]
    assert unsolved == []
    await slots.after_break()


def test_every_bundled_check_runs_python_isolated():
    """The checker's own Python runs with -I; the task's program (which must import from the workspace)
    with -s, so no user-site hook runs."""
    for task in bundled_tasks().values():
        for flag in re.findall(r"(?:^|\$\(|\|)\s*python3\s+(\S+)", task.check, re.MULTILINE):
            assert flag in ("-I", "-s"), f"{task.id}: python3 {flag}"


# --- 4. reset is total and bounded --------------------------------------------------------


def deep_tree(depth: int) -> str:
    """The issue's `for i in $(seq N); do mkdir d; cd d; done`, in Python: bash's `cd` re-reads the whole
    path each time and takes tens of seconds at this depth; the tree is the same."""
    return f'python3 -c \'import os\nfor _ in range({depth}):\n    os.mkdir("d"); os.chdir("d")\nopen("bottom", "w")\''


async def test_a_deep_tree_is_reset_and_the_slot_handed_on_empty(slots):
    lease = await slots.take()
    deep = await slots.run(lease, f"{deep_tree(1200)} && echo made")
    assert deep.ok and deep.output.endswith("made\n")
    (slots.workspace(lease) / ".hidden").write_text("x")
    await slots.after_break()


@pytest.mark.slow
async def test_a_restart_after_a_crash_resets_a_deep_tree(tmp_path):
    backend = LocalBackend(tmp_path / "data", sandbox_settings(SERVER, slots_per_container=1, sweep_interval_s=0.3))
    info = await backend.start_container()
    try:
        async with SandboxClient(info.url, info.read_token(), timeout=30) as client:
            lease = await client.send(AcquireRequest(holder=holder("crash"), ttl_s=1, wait_s=5))
            made = await client.send(execute_in(lease, "deep", ExecOp(command=deep_tree(1500))))
            assert made.ok
        assert info.pid is not None
        os.kill(info.pid, signal.SIGKILL)
        await asyncio.sleep(1.5)  # the lease lapses, so the restarted server must reset the slot
        restarted = await backend.start_container(info.container_id)
        async with SandboxClient(restarted.url, restarted.read_token(), timeout=30) as client:
            health = await client.send(HealthQuery())
            assert health.quarantined == {} and health.free == 1
            lease = await client.send(AcquireRequest(holder=holder("after"), ttl_s=30, wait_s=5))
            listing = await client.send(execute_in(lease, "ls", ExecOp(command="ls -A | wc -l")))
            assert listing.output.strip() == "0"
    finally:
        await backend.stop_container(info.container_id)
        remove_deep(tmp_path / "data")


@pytest.mark.skipif(not AS_ROOT, reason="chattr +i needs root")
async def test_a_slot_that_cannot_be_reset_is_quarantined_never_handed_on(tmp_path):
    backend = LocalBackend(tmp_path / "data", sandbox_settings(SERVER, slots_per_container=2, sweep_interval_s=0.3))
    async with running_container(backend) as (info, client):
        lease = await client.send(AcquireRequest(holder=holder("stuck"), ttl_s=60, wait_s=5))
        await client.send(execute_in(lease, "f", ExecOp(command="echo secret > left.txt")))
        # An immutable slot folder: the reset can replace neither the slot's filesystem image nor (a checked
        # volume) its workspace, as a real fault would make it.
        frozen_folder = backend.container_dir(info.container_id) / "root" / f"slot-{lease.slot}"
        health = await client.send(HealthQuery())
        if health.limits["disk"].startswith("checked"):
            frozen_folder = workspace_of(backend, info.container_id, lease.slot)
        frozen = await asyncio.to_thread(subprocess.run, ["chattr", "+i", str(frozen_folder)], check=False)
        if frozen.returncode != 0:
            pytest.skip("this filesystem has no immutable attribute")
        try:
            await client.send(release_of(lease))
            health = await client.send(HealthQuery())
            for _ in range(50):
                if health.quarantined:
                    break
                await asyncio.sleep(0.1)
                health = await client.send(HealthQuery())
            assert list(health.quarantined) == [lease.slot] and health.free == 1
            states = {state.slot: state for state in await client.send(SlotsQuery())}
            assert states[lease.slot].quarantined
            others = [
                await client.send(AcquireRequest(holder=holder(f"next-{i}"), ttl_s=60, wait_s=0)) for i in range(1)
            ]
            assert all(other.slot != lease.slot for other in others)
            with pytest.raises(SlotUnavailable):
                await client.send(AcquireRequest(holder=holder("no-more"), ttl_s=60, wait_s=0))
        finally:
            await asyncio.to_thread(subprocess.run, ["chattr", "-i", str(frozen_folder)], check=True)
        # A restart neither fails on the slot nor keeps it dirty.
        await backend.stop_container(info.container_id)
        restarted = await backend.start_container(info.container_id)
        async with SandboxClient(restarted.url, restarted.read_token()) as again:
            assert (await again.send(HealthQuery())).quarantined == {}
            assert not (workspace_of(backend, info.container_id, lease.slot) / "left.txt").exists()


# --- 5. network on never reaches the control plane unacknowledged ------------------------


async def test_network_on_is_refused_unless_acknowledged(slots):
    with pytest.raises(SandboxRequired, match="control plane"):
        await slots.take(allow_network=True)
    await slots.after_break()


def test_network_is_the_envs_choice_on_the_worker_not_the_workflow_inputs():
    from activities.slots import AcquireSlotInput, slot_terms
    from envs.base import Env

    assert not Env.allow_network
    assert slot_terms(AcquireSlotInput(allow_network=True)) == (False, None)
    assert slot_terms(AcquireSlotInput(env="terminal_tasks", allow_network=True)) == (False, None)


def test_network_acknowledgement_and_limits_reach_the_server_argv(tmp_path):
    settings = Settings(sandbox={"allow_network_unprotected": True, "memory_limit_mb": 512})
    argv = settings.sandbox.for_container(root=tmp_path, token_env="T").argv()
    assert "--allow-network-unprotected" in argv
    assert argv[argv.index("--memory-limit-mb") + 1] == "512"
    assert "--no-allow-network-unprotected" in Settings().sandbox.for_container(root=tmp_path, token_env="T").argv()


# --- 6. no silent fallback, no inherited secrets -----------------------------------------


@pytest.mark.slow
async def test_the_server_and_its_commands_hold_no_worker_secrets(slots, server):
    info, _ = server
    environ = Path(f"/proc/{info.pid}/environ").read_bytes()
    assert b"sk-must-not-leak" not in environ and b"WORKER_API_KEY_FOR_TEST" not in environ
    lease = await slots.take()
    result = await slots.run(lease, "env; cat /etc/shadow; cat /proc/1/environ | tr '\\0' '\\n'")
    assert "sk-must-not-leak" not in result.output
    assert "root:" not in result.output
    await slots.after_break()


def test_server_environment_keeps_only_what_it_needs(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "aws-secret")
    env = server_environment()
    assert "sk-secret" not in env.values() and "aws-secret" not in env.values()
    assert set(env) <= {"PATH", "LANG", "LC_ALL", "TZ", "TMPDIR", "PYTHONPATH", "PYTHONNOUSERSITE"}


def test_isolation_is_required_by_default():
    assert Settings().sandbox.require_isolation is True
    assert LocalBackend(Path("/nonexistent")).sandbox.require_isolation is True


async def test_without_bubblewrap_commands_are_refused_unless_explicitly_allowed(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(bubblewrap, "bubblewrap_path", lambda: None)
    async with SlotManager(ContainerConfig(root=tmp_path / "root", slots_per_container=1, container_id="c")) as strict:
        lease = await strict.acquire(holder("strict"), ttl_s=30, wait_s=0)
        from temporal_rollouts.sandbox_server.schema import ExecuteRequest

        with pytest.raises(SandboxRequired):
            await strict.execute(
                ExecuteRequest(slot=0, lease_id=lease.lease_id, call_id="c1", operation=ExecOp(command="touch ran"))
            )
        assert not (strict.leased_slot(0, lease.lease_id).workspace / "ran").exists()
    for _ in range(2):  # warns on every start
        caplog.clear()
        async with SlotManager(
            ContainerConfig(root=tmp_path / "loose", slots_per_container=1, container_id="c", require_isolation=False)
        ):
            pass
        assert any("UNISOLATED" in record.getMessage() for record in caplog.records)


# --- 7. snapshots keep links, and never follow them on the host ---------------------------


async def test_a_workspace_with_a_venv_is_saved_and_restored_as_is(slots, tmp_path):
    lease = await slots.take()
    made = await slots.run(
        lease,
        "mkdir -p venv/bin venv/lib && ln -s /usr/bin/python3 venv/bin/python && ln -s python venv/bin/python3 "
        "&& ln -s /etc/passwd abs-outside && ln -s ../../../.. rel-outside && echo data > venv/lib/x "
        "&& ln venv/lib/x venv/lib/hard && chmod 755 venv/lib/x && mkfifo pipe && echo ok",
    )
    assert made.ok, made.output
    data = await _archive(slots, lease, tmp_path)
    await slots.release_all()
    fresh = await slots.take()
    restored = await _restore(slots, fresh, data, tmp_path)
    assert restored.entries >= 8
    workspace = slots.workspace(fresh)
    assert os.readlink(workspace / "venv/bin/python") == "/usr/bin/python3"
    assert os.readlink(workspace / "venv/bin/python3") == "python"
    assert os.readlink(workspace / "abs-outside") == "/etc/passwd"
    assert not (workspace / "pipe").exists()
    ran = await slots.run(fresh, "venv/bin/python3 -c 'print(6 * 7)'; cat venv/lib/hard; stat -c %a venv/lib/x")
    assert ran.output.split() == ["42", "data", "755"]
    again = await _archive(slots, fresh, tmp_path)
    assert _entries(again) == _entries(data)
    with pytest.raises(BadToolRequest):  # read on the host: the link is not followed out
        await slots.client.send(execute_in(fresh, "r", ReadFileOp(path="abs-outside")))
    await slots.after_break()


async def test_a_snapshot_cannot_write_through_a_link(slots, tmp_path):
    target = tmp_path / "host-dir"
    target.mkdir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        link = tarfile.TarInfo("escape")
        link.type, link.linkname = tarfile.SYMTYPE, str(target)
        tar.addfile(link)
        payload = b"pwned"
        member = tarfile.TarInfo("escape/pwned")
        member.size = len(payload)
        tar.addfile(member, io.BytesIO(payload))
    lease = await slots.take()
    with pytest.raises(BadToolRequest):
        await _restore(slots, lease, buffer.getvalue(), tmp_path)
    assert list(target.iterdir()) == []
    await slots.after_break()


async def _archive(slots, lease: SlotLease, folder: Path) -> bytes:
    """The workspace as a snapshot takes it: streamed as a gzipped tar."""
    spool = folder / f"{uuid.uuid4().hex}.tar.gz"
    query = TransferQuery(slot=lease.slot, lease_id=lease.lease_id, path=".", format="tar.gz", max_bytes=10_000_000)
    await slots.client.download(query, spool)
    return spool.read_bytes()


async def _restore(slots, lease: SlotLease, data: bytes, folder: Path) -> TransferResult:
    """A snapshot restored as a resume does: streamed in, replacing the workspace."""
    spool = folder / f"{uuid.uuid4().hex}.tar.gz"
    spool.write_bytes(data)
    query = TransferQuery(slot=lease.slot, lease_id=lease.lease_id, path=".", format="tar.gz", replace=True)
    return await slots.client.upload(query, spool)


def _entries(data: bytes) -> list[tuple[str, str, str, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        return sorted((m.name, m.type.decode(), m.linkname, m.mode) for m in tar.getmembers())


# --- 8. a command of any length ----------------------------------------------------------


async def test_a_200_kb_heredoc_runs(slots):
    lease = await slots.take()
    body = "\n".join(f"line {i:06d} " + "x" * 40 for i in range(4000))
    assert len(body) > 200_000
    result = await slots.run(lease, f"cat > big.txt <<'EOF'\n{body}\nEOF\nwc -l < big.txt; tail -1 big.txt")
    assert result.ok, result.output[:500]
    assert result.output.splitlines()[0] == "4000"
    await slots.after_break()


async def test_commands_still_read_their_own_stdin_as_empty(slots):
    lease = await slots.take()
    result = await slots.run(lease, "cat; echo after", timeout_s=10)
    assert result.ok and result.output == "after\n"
    await slots.after_break()


@pytest.mark.skipif(not AS_ROOT, reason="the fallback is for a root-run server")
async def test_root_that_cannot_mount_drops_the_slot_uid_before_bubblewrap(monkeypatch):
    """Where root may not mount (a container without CAP_SYS_ADMIN), bwrap runs in a user namespace of
    the slot's uid instead: the command still runs unprivileged, inside and outside."""
    import tempfile

    from temporal_rollouts.sandbox_server.limits.confinement import Confinement

    monkeypatch.setattr(bubblewrap, "bubblewrap_strategy", lambda: "userns")
    with tempfile.TemporaryDirectory(dir="/tmp") as top:
        os.chmod(top, 0o755)
        workspace = Path(top) / "workspace"
        confinement = Confinement.detect(SlotLimits(tmp_limit_mb=8), UID_BASE, "fallback", use_cgroups=False)
        from temporal_rollouts.sandbox_server.files.workspace import prepare_workspace

        prepare_workspace(workspace, (UID_BASE + 2, UID_BASE + 2))
        result = await bubblewrap.run_command(
            "id -u; cp /bin/bash sh4 && chmod 4755 sh4 && ./sh4 -p -c 'echo euid=$(id -u)'; df -k /tmp | tail -1",
            bubblewrap.SlotSandbox(workspace, slot=2, confinement=confinement),
            timeout_s=30,
            max_output_chars=10_000,
        )
        assert result.output.splitlines()[0] == str(UID_BASE + 2), result.output
        assert f"euid={UID_BASE + 2}" in result.output
        assert (workspace / "sh4").stat().st_uid == UID_BASE + 2
        assert " 8192 " in result.output


@pytest.mark.parametrize("resident", [False, True], ids=["own-sandbox", "resident"])
async def test_a_server_killed_mid_command_leaves_nothing_running(tmp_path, resident):
    """Without cgroups to sweep, the command still dies with its server: bwrap's --die-with-parent,
    or the resident launcher's socket closing (the launcher exits, and its sandbox with it)."""
    backend = LocalBackend(tmp_path / "data", sandbox_settings(NO_CGROUPS, slots_per_container=1, sweep_interval_s=0.3))
    info = await backend.start_container()
    marker = unique_sleep()
    try:
        async with SandboxClient(info.url, info.read_token(), timeout=30) as client:
            lease = await client.send(AcquireRequest(holder=holder("killed"), ttl_s=60, wait_s=5))
            running = asyncio.create_task(
                client.send(
                    execute_in(lease, "long", ExecOp(command=f"sleep {marker}", timeout_s=600, resident=resident))
                )
            )
            assert await wait_until(lambda: processes_running(marker) != [], timeout_s=15)
            assert info.pid is not None
            os.kill(info.pid, signal.SIGKILL)
            assert await wait_until(lambda: processes_running(marker) == [], timeout_s=15), processes_running(marker)
            running.cancel()
            await asyncio.gather(running, return_exceptions=True)
    finally:
        await backend.stop_container(info.container_id)


def narrowing(lease: SlotLease, limits: SlotLimitsRequest) -> NarrowRequest:
    return NarrowRequest(slot=lease.slot, lease_id=lease.lease_id, limits=limits)


async def test_an_env_can_narrow_a_leases_limits_but_never_widen_them(slots):
    """An env's `sandbox_limits` lower the server's for its lease only; the next holder gets the server's."""
    lease = await slots.take()
    allocate = 'python3 -c \'x = bytearray(160 << 20); x[::4096] = b"y" * len(x[::4096]); print("GOT", 6 * 7)\''
    assert "GOT 42" in (await slots.run(lease, allocate)).output  # 160 MiB fits the server's 256
    narrowed = await slots.client.send(narrowing(lease, SlotLimitsRequest(memory_limit_mb=64)))
    assert narrowed.memory_limit_mb == 64 and narrowed.max_processes == 64
    assert "GOT 42" not in (await slots.run(lease, allocate)).output
    wider = SlotLimitsRequest(memory_limit_mb=100_000, disk_limit_mb=0, tmp_limit_mb=4)
    widened = await slots.client.send(narrowing(lease, wider))
    assert widened.memory_limit_mb == 64 and widened.disk_limit_mb == 100 and widened.tmp_limit_mb == 4
    tmp = await slots.run(lease, "head -c 8M /dev/zero > /tmp/x; echo rc=$?")
    assert "rc=1" in tmp.output
    await slots.release_all()
    again = await slots.take()
    assert "GOT 42" in (await slots.run(again, allocate)).output
    await slots.after_break()


def test_an_envs_limits_are_read_on_the_worker(monkeypatch):
    from activities.slots import AcquireSlotInput, slot_terms
    from envs.terminal_tasks import TerminalTasksEnv

    monkeypatch.setattr(TerminalTasksEnv, "sandbox_limits", {"memory_limit_mb": 512})
    allow_network, limits = slot_terms(AcquireSlotInput(env="terminal_tasks"))
    assert allow_network is False and limits == SlotLimitsRequest(memory_limit_mb=512)
