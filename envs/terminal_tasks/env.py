"""The `terminal_tasks` env: small shell chores graded by a bash check run in the slot."""

from __future__ import annotations

import shlex
from typing import Any

from envs.base import Env, SlotHandle
from envs.registry import register_env
from envs.terminal_tasks.loader import bundled_tasks
from envs.terminal_tasks.model import TerminalTask
from temporal_rollouts.core.errors import BadItem, TaskError
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.tasks import Item, ScriptedCall, Verdict
from temporal_rollouts.sandbox_server.schema import ToolOutput

SYSTEM_PROMPT = """\
You are an agent working in a Linux sandbox. Your working directory is /workspace; \
it holds every file of the task, and relative paths are resolved against it.

Tools:
- terminal(command, timeout?): run a bash command in a fresh shell in /workspace and see its output.
- terminal_stateful(command, timeout?): run a command in your persistent shell, where the \
directory, variables and background processes carry over between calls.
- read_file(path): read a text file.
- write_file(path, content): create or overwrite a text file.
- search(pattern, path?): find lines matching a regular expression under a path.

Only common command-line tools and the Python 3 standard library (python3) are \
available, and there is no network. Do what the task asks, check your work, and \
when you are done reply with a short summary without calling any tool."""

CHECK_TIMEOUT_S = 60.0
CHECK_PRELUDE = "export PYTHONNOUSERSITE=1\nunset PYTHONPATH PYTHONSTARTUP BASH_ENV ENV\n"
"""Before every check: no Python user site (the agent's HOME is its workspace, so a planted
usercustomize or .pth would run in every python3 the check starts). The bundled checks also run
their own Python with `python3 -I`, which keeps the workspace off the import path."""
OUTPUT_TAIL_CHARS = 2000


@register_env
class TerminalTasksEnv(Env):
    """Bundled shell tasks; the task is looked up by id at every hook, so a fixed check applies at once."""

    name = "terminal_tasks"
    tool_names = ("terminal", "terminal_stateful", "read_file", "write_file", "search")

    def tasks(self) -> dict[str, TerminalTask]:
        return bundled_tasks()

    def task(self, item: Item) -> TerminalTask:
        try:
            return self.tasks()[item.id]
        except KeyError:
            raise BadItem(f"{self.name} has no task {item.id!r}") from None

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        ids = list(self.tasks())
        if not ids:
            return []
        return [Item(id=ids[(offset + i) % len(ids)]) for i in range(count)]

    def item_count(self) -> int | None:
        return len(self.tasks())

    def system_prompt(self) -> str | None:
        return SYSTEM_PROMPT

    def format_prompt(self, item: Item) -> str:
        return self.task(item).prompt

    async def setup_workspace(self, item: Item, slot: SlotHandle) -> dict[str, Any]:
        task = self.task(item)
        for index, (path, content) in enumerate(task.files.items()):
            _must_succeed(task, path, await slot.write_file(f"file-{index}", path, content))
        if task.executable:
            _must_succeed(task, "chmod", await slot.exec("chmod", "chmod +x -- " + _quoted(task.executable)))
        return {"task": task.id, "files": len(task.files)}

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        task = self.task(item)
        if task.check_in_session:
            command = _in_session(CHECK_PRELUDE + task.check)
            result = await slot.terminal_stateful(command, timeout=CHECK_TIMEOUT_S, key="check")
        else:
            result = await slot.exec("check", CHECK_PRELUDE + task.check, timeout_s=CHECK_TIMEOUT_S)
        solved = result.exit_code == 0 and not result.timed_out
        return Verdict(
            score=1.0 if solved else 0.0,
            details={
                "task": task.id,
                "exit_code": result.exit_code,
                "timed_out": result.timed_out,
                "output": result.output[-OUTPUT_TAIL_CHARS:],
            },
        )

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        return self.task(item).turns()


def _in_session(check: str) -> str:
    """The check as one command typed into the agent's session: a clean bash in /workspace, so the
    session's directory, variables, aliases and (unexported) functions do not steer it. The agent
    owns that shell, so this is no security boundary; it keeps honest mistakes from passing or failing."""
    return (
        "unalias -a; unset -f command env bash 2>/dev/null; "
        f"command /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/workspace LANG=C.UTF-8 "
        f"/bin/bash --noprofile --norc -c {shlex.quote('cd /workspace || exit 2' + chr(10) + check)}"
    )


def _quoted(paths: Any) -> str:
    return " ".join(shlex.quote(path) for path in paths)


def _must_succeed(task: TerminalTask, what: str, result: ToolOutput) -> None:
    if not result.ok:
        raise TaskError(f"setting up task {task.id!r} failed at {what}: {result.output[-500:]}")
