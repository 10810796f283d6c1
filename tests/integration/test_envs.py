"""Envs: the registry, and every bundled terminal task run for real in a bubblewrap workspace."""

from __future__ import annotations

import asyncio
import functools
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

import envs
from envs.base import Env
from envs.echo_chain import EchoChainEnv
from envs.registry import get_env, register_env
from envs.terminal_tasks import TerminalTask, bundled_tasks, load_tasks_from
from envs.terminal_tasks.loader import TASKS_DIR
from temporal_rollouts.core.errors import BadItem, ConfigError, UnknownEnv
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.tasks import Item, ScriptedCall
from temporal_rollouts.sandbox_server.schema import ToolOutput

WORKSPACE = "/workspace"
TASK_IDS = list(bundled_tasks())
ONE_SHOT_TASK_IDS = [task_id for task_id, task in bundled_tasks().items() if not task.check_in_session]
"""Tasks BwrapSlot can play; the ones checked in the stateful terminal run on the real sandbox server
(tests/integration/test_stateful_task.py)."""


@functools.cache
def bwrap_works() -> bool:
    if not shutil.which("bwrap"):
        return False
    probe = subprocess.run(["bwrap", "--ro-bind", "/", "/", "--unshare-all", "true"], capture_output=True)
    return probe.returncode == 0


needs_bwrap = pytest.mark.skipif(not bwrap_works(), reason="bubblewrap is missing or cannot create namespaces here")


class BwrapSlot:
    """A minimal SlotHandle: one host directory mounted at /workspace in a fresh bubblewrap sandbox per command."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.keys: list[str] = []

    def _key(self, key: str) -> None:
        assert key not in self.keys, f"slot key {key!r} reused within a hook"
        self.keys.append(key)

    def host_path(self, path: str) -> Path:
        if path == WORKSPACE or path.startswith(WORKSPACE + "/"):
            path = path[len(WORKSPACE) :].lstrip("/") or "."
        assert not path.startswith("/"), f"path outside the workspace: {path}"
        resolved = (self.root / path).resolve()
        assert resolved.is_relative_to(self.root.resolve()), f"path escapes the workspace: {path}"
        return resolved

    async def exec(self, key: str, command: str, timeout_s: float = 60.0, *, read_only: bool = False) -> ToolOutput:
        self._key(key)
        return await self._run(key, command, timeout_s, read_only)

    async def _run(self, key: str, command: str, timeout_s: float, read_only: bool = False) -> ToolOutput:
        argv = [
            "bwrap",
            "--ro-bind",
            "/usr",
            "/usr",
            "--symlink",
            "usr/bin",
            "/bin",
            "--symlink",
            "usr/lib",
            "/lib",
            "--symlink",
            "usr/lib64",
            "/lib64",
            "--ro-bind",
            "/etc",
            "/etc",
            "--proc",
            "/proc",
            "--dev",
            "/dev",
            "--tmpfs",
            "/tmp",
            "--ro-bind" if read_only else "--bind",
            str(self.root),
            WORKSPACE,
            "--chdir",
            WORKSPACE,
            "--unshare-all",
            "--die-with-parent",
            "bash",
            "-c",
            command,
        ]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        try:
            out, _ = await asyncio.wait_for(proc.communicate(), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return ToolOutput(call_id=key, ok=False, output="timed out", timed_out=True)
        code = proc.returncode
        return ToolOutput(call_id=key, ok=code == 0, output=out.decode(errors="replace"), exit_code=code)

    async def write_file(self, key: str, path: str, content: str) -> ToolOutput:
        self._key(key)
        target = self.host_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
        return ToolOutput(call_id=key, ok=True, output=f"wrote {len(content)} characters to {path}")

    async def read_file(self, key: str, path: str) -> ToolOutput:
        self._key(key)
        try:
            return ToolOutput(call_id=key, ok=True, output=self.host_path(path).read_text())
        except OSError as err:
            return ToolOutput(call_id=key, ok=False, output=str(err))

    async def search(self, key: str, pattern: str, path: str = ".") -> ToolOutput:
        self._key(key)
        return await self._run(key, f"grep -rnHIsP -e {shlex.quote(pattern)} -- {shlex.quote(path)}", 30.0)

    async def stop_terminal(self, *, key: str) -> ToolOutput:
        self._key(key)
        return ToolOutput(call_id=key, ok=True, output="no terminal session was running")

    async def stop_processes(self, *, key: str) -> ToolOutput:
        self._key(key)
        return ToolOutput(call_id=key, ok=True, output="stopped every process of the slot (none was left running)")


async def play(slot: BwrapSlot, turns: list[list[ScriptedCall]]) -> list[ToolOutput]:
    """Run a reference solution's calls the way the tool layer would."""
    outputs = []
    for turn_index, turn in enumerate(turns):
        for call_index, call in enumerate(turn):
            key = f"turn-{turn_index}-call-{call_index}"
            args = call.arguments
            if call.name == "terminal":
                outputs.append(await slot.exec(key, args["command"], float(args.get("timeout", 60))))
            elif call.name == "write_file":
                outputs.append(await slot.write_file(key, args["path"], args["content"]))
            elif call.name == "read_file":
                outputs.append(await slot.read_file(key, args["path"]))
            elif call.name == "search":
                outputs.append(await slot.search(key, args["pattern"], args.get("path", ".")))
            else:
                raise AssertionError(f"unknown tool {call.name!r}")
    return outputs


# registry ----------------------------------------------------------------------------------------


def test_bundled_envs_are_registered_on_import():
    assert {"terminal_tasks", "echo_chain"} <= set(envs.env_names())
    assert isinstance(envs.get_env("terminal_tasks"), Env)
    assert envs.get_env("echo_chain", {"steps": 5}).steps == 5


def test_unknown_env_lists_known_names():
    with pytest.raises(UnknownEnv) as info:
        get_env("no_such_env")
    assert "no_such_env" in info.value.message
    assert "terminal_tasks" in info.value.message and "echo_chain" in info.value.message
    assert not info.value.retryable


def test_register_env_rejects_a_name_clash_and_a_missing_name():
    class Clash(EchoChainEnv):
        name = "terminal_tasks"

    with pytest.raises(ValueError, match="already taken"):
        register_env(Clash)

    class Nameless(EchoChainEnv):
        name = ""

    with pytest.raises(TypeError):
        register_env(Nameless)
    assert envs.get_env("terminal_tasks").__class__.__name__ == "TerminalTasksEnv"


# terminal_tasks: the task set --------------------------------------------------------------------


def test_task_set_is_large_and_uses_every_tool():
    tasks = bundled_tasks()
    assert len(tasks) >= 12
    tools_used = {call.name for task in tasks.values() for turn in task.solution for call in turn}
    assert tools_used == {"terminal", "terminal_stateful", "read_file", "write_file", "search"}
    assert sum(len(task.solution) >= 2 for task in tasks.values()) >= 8
    assert any(len(task.solution) == 3 for task in tasks.values())
    assert all(task.solution and all(task.solution) for task in tasks.values())


def test_items_cycle_through_the_tasks_and_carry_only_ids():
    env = get_env("terminal_tasks")
    items = env.load_items(len(TASK_IDS) + 3, offset=2)
    assert [item.id for item in items[: len(TASK_IDS) - 2]] == TASK_IDS[2:]
    assert [item.id for item in items[-5:]] == TASK_IDS[:5]
    assert all(item.data == {} for item in items)


def test_prompt_messages_are_system_then_task():
    env = get_env("terminal_tasks")
    item = Item(id="csv-to-json")
    messages = env.prompt_messages(item)
    assert [m.role for m in messages] == ["system", "user"]
    assert "/workspace" in messages[0].content and "terminal" in messages[0].content
    assert messages[1].content == bundled_tasks()["csv-to-json"].prompt


async def test_unknown_item_is_a_bad_item(tmp_path):
    env = get_env("terminal_tasks")
    ghost = Item(id="no-such-task")
    with pytest.raises(BadItem, match="no-such-task"):
        env.format_prompt(ghost)
    with pytest.raises(BadItem):
        env.reference_solution(ghost)
    with pytest.raises(BadItem):
        await env.setup_workspace(ghost, BwrapSlot(tmp_path))
    with pytest.raises(BadItem):
        await env.verify(ghost, BwrapSlot(tmp_path), [])


def test_task_json_accepts_lines_and_rejects_bad_paths(tmp_path):
    task = {
        "id": "tiny",
        "prompt": "p",
        "files": {"a/b.txt": ["one", "two"], "c.txt": "no newline"},
        "check": ["test -f a/b.txt", "exit 0"],
        "solution": [[{"name": "terminal", "arguments": {"command": "true"}}]],
    }
    parsed = TerminalTask.model_validate(task)
    assert parsed.files == {"a/b.txt": "one\ntwo\n", "c.txt": "no newline"}
    assert parsed.check == "test -f a/b.txt\nexit 0\n"
    with pytest.raises(ValueError, match="relative"):
        TerminalTask.model_validate({**task, "files": {"/etc/passwd": "x"}})
    with pytest.raises(ValueError, match="executable"):
        TerminalTask.model_validate({**task, "executable": ["missing.sh"]})
    shutil.copytree(TASKS_DIR / "csv-to-json", tmp_path / "renamed")
    assert list(load_tasks_from(tmp_path)) == ["renamed"], "a task is named by its folder, as Harbor names it"
    (tmp_path / "renamed" / "task.toml").write_text("[verifier]\ntimeout_sec = -5\n")
    with pytest.raises(ValueError, match="renamed/task.toml: \\[verifier\\] timeout_sec"):
        load_tasks_from(tmp_path)


@needs_bwrap
async def test_verify_reads_the_task_definition_at_verify_time(tmp_path, monkeypatch):
    env = get_env("terminal_tasks")
    item = env.load_items(1)[0]
    fixed = bundled_tasks()[item.id].model_copy(update={"check": "echo patched; exit 0\n"})
    monkeypatch.setattr(env, "tasks", lambda: {item.id: fixed})
    verdict = await env.verify(item, BwrapSlot(tmp_path), [])
    assert verdict.score == 1.0 and verdict.details["output"] == "patched\n"


# terminal_tasks: every task, for real ------------------------------------------------------------


@needs_bwrap
@pytest.mark.parametrize("task_id", ONE_SHOT_TASK_IDS)
async def test_untouched_workspace_fails(task_id, tmp_path):
    env = get_env("terminal_tasks")
    item = Item(id=task_id)
    slot = BwrapSlot(tmp_path)
    meta = await env.setup_workspace(item, slot)
    assert meta["task"] == task_id
    task = bundled_tasks()[task_id]
    for path, content in task.files.items():
        assert (tmp_path / path).read_text() == content
    for path in task.executable:
        assert (tmp_path / path).stat().st_mode & 0o111
    verdict = await env.verify(item, slot, [])
    assert verdict.score == 0.0, verdict.details
    assert verdict.details["exit_code"] not in (0, None)
    assert "FAIL" in verdict.details["output"] or "Error" in verdict.details["output"], verdict.details


@needs_bwrap
@pytest.mark.parametrize("task_id", ONE_SHOT_TASK_IDS)
async def test_reference_solution_passes(task_id, tmp_path):
    env = get_env("terminal_tasks")
    item = Item(id=task_id)
    slot = BwrapSlot(tmp_path)
    await env.setup_workspace(item, slot)
    turns = env.reference_solution(item)
    outputs = await play(slot, turns)
    last_turn = outputs[-len(turns[-1]) :]
    assert all(out.ok for out in last_turn), [out.output for out in last_turn]
    transcript = [Message(role="user", content=env.format_prompt(item))]
    verdict = await env.verify(item, slot, transcript)
    assert verdict.score == 1.0, verdict.details
    assert verdict.details == {"task": task_id, "exit_code": 0, "timed_out": False, "output": verdict.details["output"]}
    assert verdict.details["output"].strip().endswith("OK")


# echo_chain ---------------------------------------------------------------------------------------


def test_echo_chain_items_prompt_and_solution():
    env = get_env("echo_chain", {"steps": 4})
    items = env.load_items(3, offset=10)
    assert [item.id for item in items] == ["echo-10", "echo-11", "echo-12"]
    prompt = env.format_prompt(items[0])
    assert prompt.startswith("Task echo-10:") and "4. echo step-4 | tee -a chain.log" in prompt
    assert "step-5" not in prompt
    turns = env.reference_solution(items[0])
    expected = [[f"echo step-{k} | tee -a chain.log"] for k in range(1, 5)]
    assert [[c.arguments["command"] for c in turn] for turn in turns] == expected
    slow = get_env("echo_chain", {"steps": 1, "sleep_s": 2})
    assert slow.reference_solution(items[0])[0][0].arguments["command"].startswith("sleep 2; ")
    assert all(len(turn) == 1 and turn[0].name == "terminal" for turn in turns)
    assert env.tool_names == ("terminal",)


def test_echo_chain_solution_can_be_read_back_from_any_prompt():
    seven = get_env("echo_chain", {"steps": 7})
    item = seven.load_items(1, offset=3)[0]
    default = get_env("echo_chain")
    assert default.solution_for_prompt(seven.format_prompt(item)) == seven.reference_solution(item)
    assert default.solution_for_prompt("Fix the bug in stats.py") is None


def test_echo_chain_rejects_bad_config_and_items():
    with pytest.raises(ConfigError):
        get_env("echo_chain", {"steps": 0})
    env = get_env("echo_chain")
    with pytest.raises(BadItem):
        env.format_prompt(Item(id="csv-to-json"))
    with pytest.raises(BadItem):
        env.reference_solution(Item(id="echo-1", data={"steps": "many"}))
    with pytest.raises(ConfigError):
        get_env("echo_chain", {"sleep_s": -1})


@needs_bwrap
async def test_echo_chain_scores_each_step_once_in_order(tmp_path):
    env = get_env("echo_chain")
    item = env.load_items(1)[0]
    slot = BwrapSlot(tmp_path)
    assert await env.setup_workspace(item, slot) == {}
    assert (await env.verify(item, slot, [])).score == 0.0
    turns = env.reference_solution(item)
    outputs = await play(slot, turns)
    assert [out.output for out in outputs] == ["step-1\n", "step-2\n", "step-3\n"]
    slot.keys.clear()  # each verify below stands for a separate rollout's hook
    verdict = await env.verify(item, slot, [])
    assert verdict.score == 1.0 and verdict.details["steps"] == 3
    await slot.exec("again", turns[-1][0].arguments["command"])  # a step executed twice
    slot.keys.clear()
    assert (await env.verify(item, slot, [])).score == 0.0
