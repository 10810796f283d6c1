"""The `harbor` env: a folder of Harbor task folders (or one task folder) as a dataset.

Config: `{"path": "/abs/folder", "verifier": "pristine" | "shared", "internet": false}`.
- `path`: a folder of task folders, or one task folder, as every worker host sees it (like an image's build
  context); `rollouts batch --tasks PATH` sets it. Unset: the example tasks in `examples/harbor`.
- `verifier`: `pristine` (the default) runs `tests/test.sh` on the task's image as built, with the agent's
  working folder carried over; `shared` on the root the agent changed, as Harbor does by default. A task
  that says `[verifier] environment_mode = "shared"` gets `shared` either way (its tests need the agent's
  system changes).
- `internet`: the sandbox servers allow networked slots (`sandbox.allow_network_unprotected`); without it a
  task that asks for a network runs without one, and its verdict says so in one line.

Items are the task folders' names in name order. Every task of the dataset is read and checked when the
batch asks how many items there are (its first step), so a broken `task.toml` stops the batch before any
rollout, naming the file and field. The task is read again at every hook, so a fixed test applies at once.
"""

from __future__ import annotations

import base64
import gzip
import hashlib
import io
import json
import logging
import math
import re
import shlex
import tarfile
import tempfile
from functools import cached_property
from pathlib import Path
from typing import Any

from envs.base import Env, SlotHandle
from envs.harbor.task import MAX_TESTS_BYTES, HarborTask, HarborTaskError, load_task, task_folders
from envs.registry import register_env
from temporal_rollouts.core.errors import BadItem, ConfigError, TaskError
from temporal_rollouts.core.images import IMAGE_NAME_PATTERN, ImageSpec
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.tasks import Item, ItemTimeouts, ScriptedCall, Verdict
from temporal_rollouts.sandbox_server.schema import ToolOutput, VerifierMounts

log = logging.getLogger(__name__)

SYSTEM_PROMPT = """\
You are an agent working in a Linux sandbox built for this task. Your commands start in the task's \
working directory, and relative paths are resolved against it.

Tools:
- terminal(command, timeout?): run a bash command in a fresh shell and see its output.
- terminal_stateful(command, timeout?): run a command in your persistent shell, where the \
directory, variables and background processes carry over between calls.
- read_file(path): read a text file.
- write_file(path, content): create or overwrite a text file.
- search(pattern, path?): find lines matching a regular expression under a path.

Do what the task asks and check your work. When you are done, reply with a short summary \
without calling any tool; your work is then tested."""

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "harbor"
"""The dataset when the config names none: this project's example tasks (the demo policy knows their solutions)."""
TEST_COMMAND = "bash /tests/test.sh"
OUTPUT_TAIL_CHARS = 2000
NO_INTERNET_NOTE = "the task asks for a network; this dataset's sandboxes give none (env config `internet`)"
_reported: set[tuple[Path, tuple[str, ...]]] = set()


@register_env
class HarborEnv(Env):
    name = "harbor"
    tool_names = ("terminal", "terminal_stateful", "read_file", "write_file", "search")

    @cached_property
    def root(self) -> Path:
        path = self.config.get("path", str(EXAMPLES))
        if not isinstance(path, str) or not path.startswith("/"):
            raise ConfigError("env harbor: env_config `path` must be the absolute path of a folder of Harbor tasks")
        return Path(path)

    @cached_property
    def verifier_mode(self) -> str:
        mode = self.config.get("verifier", "pristine")
        if mode not in ("pristine", "shared"):
            raise ConfigError(f"env harbor: `verifier` must be 'pristine' or 'shared', not {mode!r}")
        return mode

    def folders(self) -> list[Path]:
        try:
            return task_folders(self.root)
        except HarborTaskError as err:
            raise ConfigError(str(err)) from None

    def check_all(self) -> list[HarborTask]:
        """Every task of the dataset, read and checked; ConfigError names the first broken one."""
        tasks = []
        for folder in self.folders():
            try:
                tasks.append(load_task(folder))
            except HarborTaskError as err:
                raise ConfigError(str(err)) from None
        return tasks

    def task(self, item: Item) -> HarborTask:
        folder = self.root if (self.root / "task.toml").is_file() else self.root / item.id
        if folder.name != item.id or "/" in item.id or item.id in ("", ".", ".."):
            raise BadItem(f"harbor dataset {self.root} has no task {item.id!r}")
        try:
            task = load_task(folder)
        except HarborTaskError as err:
            raise BadItem(str(err)) from None
        if task.notes and (task.folder, task.notes) not in _reported:
            _reported.add((task.folder, task.notes))
            for note in task.notes:
                log.warning("harbor task %s: %s", task.folder, note)
        return task

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        folders = self.folders()
        return [Item(id=folders[(offset + i) % len(folders)].name) for i in range(count)]

    def item_count(self) -> int | None:
        self.verifier_mode  # noqa: B018  (a bad option stops the batch here too)
        return len(self.check_all())

    def system_prompt(self) -> str | None:
        return SYSTEM_PROMPT

    def format_prompt(self, item: Item) -> str:
        return self.task(item).instruction

    def image(self, item: Item) -> ImageSpec | None:
        task = self.task(item)
        if task.docker_image is not None:
            return ImageSpec(reference=task.docker_image)
        return ImageSpec(
            context=str(task.environment), name=_image_name(task.name), build_timeout_s=task.build_timeout_s
        )

    def timeouts(self, item: Item) -> ItemTimeouts | None:
        task = self.task(item)
        return ItemTimeouts(agent_s=task.agent_timeout_s, verify_s=task.verifier_timeout_s)

    def slot_limits(self, item: Item) -> dict[str, float]:
        return self.task(item).limits()

    def slot_network(self, item: Item) -> bool:
        return self._gets_network(self.task(item))

    async def setup_workspace(self, item: Item, slot: SlotHandle) -> dict[str, Any]:
        task = self.task(item)
        return {"task": task.name, "notes": list(self.task_notes(task))}

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        """Stop every process of the agent, then run `tests/test.sh` with the tests read-only at /tests and a
        fresh /logs/verifier, and read the reward the server collected from it. No reward (or an unreadable
        one) is a failure of the task's verifier, never a score."""
        task = self.task(item)
        await slot.stop_processes(key="stop-processes")
        entry, archive = _tests_entry(task)
        with archive:
            await slot.share(entry, archive.name)
        mounts = VerifierMounts(tests=entry, pristine=self.verifier_mode == "pristine" and not task.shared_verifier)
        exports = "".join(f"export {name}={shlex.quote(value)}\n" for name, value in task.verifier_env.items())
        result = await slot.verifier(exports + TEST_COMMAND, mounts, timeout=task.verifier_timeout_s, key="tests")
        details: dict[str, Any] = {
            "task": task.name,
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "verifier_root": result.verifier_root,
            "output": result.output[-OUTPUT_TAIL_CHARS:],
        }
        if notes := self.task_notes(task):
            details["notes"] = notes
        if result.timed_out:
            raise TaskError(f"task {task.name}: tests/test.sh ran past its {task.verifier_timeout_s:g}s timeout")
        rewards, problem = read_reward(result)
        if problem is not None:
            tail = result.output.strip()[-300:]
            raise TaskError(f"task {task.name}: {problem}" + (f"; test output ends: {tail}" if tail else ""))
        details["rewards"] = rewards
        return Verdict(
            score=rewards["reward"] if "reward" in rewards else next(iter(rewards.values())), details=details
        )

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        """`solution/turns.json` where the task has one (this project's own: the tool calls to play, turn by
        turn), else `solution/solve.sh`, run as one terminal call that first puts the solution folder at
        /solution."""
        task = self.task(item)
        if (turns := task.solution / "turns.json").is_file():
            try:
                return [[ScriptedCall.model_validate(call) for call in turn] for turn in json.loads(turns.read_text())]
            except (ValueError, TypeError) as err:
                raise BadItem(f"{turns}: not a list of turns of tool calls: {err}") from None
        if not (task.solution / "solve.sh").is_file():
            return None
        packed = base64.b64encode(_pack(task.solution)).decode()
        command = (
            f"mkdir -p /solution && echo {packed} | base64 -d | tar -xzf - -C /solution && bash /solution/solve.sh"
        )
        return [[ScriptedCall(name="terminal", arguments={"command": command, "timeout": 600})]]

    def task_notes(self, task: HarborTask) -> list[str]:
        notes = list(task.notes)
        if task.wants_internet and not self._gets_network(task):
            notes.append(NO_INTERNET_NOTE)
        return notes

    def _gets_network(self, task: HarborTask) -> bool:
        """The task asks for a network and this dataset's sandboxes give one (`internet`)."""
        return task.wants_internet and bool(self.config.get("internet", False))


def read_reward(result: ToolOutput) -> tuple[dict[str, float], str | None]:
    """The rewards of a verifier run as Harbor defines them: `reward.json` (an object of numbers, or one
    number) wins over `reward.txt` (one number, as `{"reward": n}`); (rewards, None) or ({}, why not)."""
    for name in ("reward.json", "reward.txt"):
        found = result.collected.get(name)
        if found is None:
            continue
        if found.text is None:
            return {}, f"/logs/verifier/{name} was not read: {found.problem}"
        text = found.text.strip()
        try:
            value = json.loads(text) if name.endswith(".json") else float(text)
        except ValueError:
            return {}, f"/logs/verifier/{name} is not {'JSON' if name.endswith('.json') else 'a number'}: {text[:80]!r}"
        rewards = value if isinstance(value, dict) else {"reward": value}
        if not rewards or not all(_finite(v) for v in rewards.values()):
            return {}, f"/logs/verifier/{name} holds no finite numbers: {text[:80]!r}"
        return {str(k): float(v) for k, v in rewards.items()}, None
    return {}, "tests/test.sh wrote no reward (/logs/verifier/reward.txt or reward.json)"


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _image_name(task: str) -> str:
    name = re.sub(r"[^a-z0-9._-]+", "-", task.lower()).strip("-._")[:62] or "task"
    return name if re.match(IMAGE_NAME_PATTERN, name) else "task"


def _pack(folder: Path) -> bytes:
    """The folder as a tar.gz with fixed metadata, so equal content packs to equal bytes (and names)."""

    def plain(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
        if not (info.isfile() or info.isdir()):
            return None  # links and devices stay out: the sandbox unpacks only files and folders
        info.uid = info.gid = 0
        info.uname = info.gname = ""
        info.mtime = 0
        return info

    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed, tarfile.open(fileobj=packed, mode="w") as tar:
        for path in sorted(folder.rglob("*")):
            if path.lstat().st_size > MAX_TESTS_BYTES:
                raise TaskError(f"{path} is over {MAX_TESTS_BYTES} bytes")
            tar.add(path, arcname=str(path.relative_to(folder)), recursive=False, filter=plain)
    data = buffer.getvalue()
    if len(data) > MAX_TESTS_BYTES:
        raise TaskError(f"{folder} packs to {len(data)} bytes, over {MAX_TESTS_BYTES}")
    return data


def _tests_entry(task: HarborTask) -> tuple[str, Any]:
    """(cache entry name, a temporary file holding the tests as a tar.gz): named by their content, so every
    rollout of a task shares one entry and a changed test is a new one."""
    data = _pack(task.tests)
    digest = hashlib.sha256(data).hexdigest()[:24]
    archive = tempfile.NamedTemporaryFile(prefix="harbor-tests-", suffix=".tar.gz")
    archive.write(data)
    archive.flush()
    return f"harbor-tests-{digest}", archive
