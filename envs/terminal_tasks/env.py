"""The `terminal_tasks` env: small shell chores graded by a bash check run in the slot."""

from __future__ import annotations

import json
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from envs.base import Env, SlotHandle
from envs.registry import register_env
from envs.terminal_tasks import fingerprint
from envs.terminal_tasks.loader import bundled_image_tasks, bundled_tasks
from envs.terminal_tasks.model import TerminalTask
from temporal_rollouts.core.errors import BadItem, TaskError
from temporal_rollouts.core.images import ImageSpec
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
CHECK_PRELUDE = "export PYTHONNOUSERSITE=1 PYTHONDONTWRITEBYTECODE=1\nunset PYTHONPATH PYTHONSTARTUP BASH_ENV ENV\n"
"""Before every check: no Python user site (the agent's HOME is its workspace, so a planted
usercustomize or .pth would run in every python3 the check starts), and no bytecode written (a
check must leave the workspace as it found it). The bundled checks also run their own Python with
`python3 -I`, which keeps the workspace off the import path."""
ONE_SHOT_PRELUDE = "export HOME=/tmp\n"
"""A one-shot check's HOME is its own /tmp (a tmpfs of that command alone), not the agent's workspace."""
FINGERPRINT_COMMAND = (
    "python3 -I -S - --read-only /workspace <<'__FINGERPRINT__'\n"
    f"{Path(fingerprint.__file__).read_text()}__FINGERPRINT__\n"
)
"""Run read-only, like the check it frames: it fails (no digests) unless the workspace is mounted so."""
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
            return _verdict(task, result, checked_in_agent_shell=True)
        # Nothing of the agent may run while it is checked: every process of the slot goes first, and the
        # check sees the workspace read-only, so neither a leftover nor a program it runs can change it.
        await slot.stop_processes(key="stop-processes")
        before = await _fingerprint(slot, "fingerprint-before")
        check = ONE_SHOT_PRELUDE + CHECK_PRELUDE + task.check
        result = await slot.exec("check", check, timeout_s=CHECK_TIMEOUT_S, read_only=True)
        after = await _fingerprint(slot, "fingerprint-after")
        if isinstance(before, str) or isinstance(after, str):
            blind = before if isinstance(before, str) else after
            return _verdict(task, result, workspace_changed=["(fingerprint failed)"], fingerprint_failed=blind)
        return _verdict(task, result, workspace_changed=fingerprint.changed(before, after))

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        return self.task(item).turns()

    def image(self, item: Item) -> ImageSpec | None:
        task = self.task(item)
        return ImageSpec(context=task.context, name=task.id) if task.context else super().image(item)


@register_env
class ImageTasksEnv(TerminalTasksEnv):
    """Terminal tasks that need their own image: a package the sandbox host lacks, Python with pytest, a
    service account only root could make. Each is built from its folder's `environment/`; they run only where
    item images do (`docs/images.md`)."""

    name = "image_tasks"

    def tasks(self) -> dict[str, TerminalTask]:
        return bundled_image_tasks()


async def _fingerprint(slot: SlotHandle, key: str) -> dict[str, str] | str:
    """The workspace's digests, or why there are none (the check then fails: see `fingerprint`)."""
    result = await slot.exec(key, FINGERPRINT_COMMAND, timeout_s=CHECK_TIMEOUT_S, read_only=True)
    if result.ok:
        try:
            prints = json.loads(result.output)
        except ValueError:
            prints = None
        if isinstance(prints, dict) and all(isinstance(v, str) for v in prints.values()):
            return prints
    return (result.output.strip() or f"exit {result.exit_code}")[-OUTPUT_TAIL_CHARS:]


def _verdict(
    task: TerminalTask,
    result: ToolOutput,
    *,
    workspace_changed: Sequence[str] = (),
    checked_in_agent_shell: bool = False,
    fingerprint_failed: str | None = None,
) -> Verdict:
    solved = result.exit_code == 0 and not result.timed_out and not workspace_changed
    details: dict[str, Any] = {
        "task": task.id,
        "exit_code": result.exit_code,
        "timed_out": result.timed_out,
        "output": result.output[-OUTPUT_TAIL_CHARS:],
    }
    if workspace_changed:
        details["workspace_changed"] = list(workspace_changed)[:20]
    if fingerprint_failed is not None:
        details["fingerprint_failed"] = fingerprint_failed
    if checked_in_agent_shell:
        details["checked_in_agent_shell"] = True
    return Verdict(score=1.0 if solved else 0.0, details=details)


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
