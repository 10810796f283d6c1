"""The `write_word` env: create a named file holding one word, with the `write_file` tool.

Made for proving that RL on this stack trains (examples/grpo): SmolLM2-135M-Instruct
almost never writes a tool call unprompted, but after two worked examples (earlier
turns in which the assistant answered a request like this one with a `write_file`
call) it writes a file in about a quarter of its tries (35 of 128, 9 of them the right
word in the right file: mean reward 0.15). That leaves room a tiny model climbs in
tens of steps on two cores (0.98 after 30 steps in examples/grpo's run).

The examples are assistant turns with calls and no tool results, so a chat API that
demands a result after every call refuses the prompt, and the demo policy (which reads
the first user message) does not know the task; set `examples` to 0 for either.
Run it with one model turn (`limits.max_turns = 1`): the turn's calls still run, then
the rollout stops and is scored.

The grader runs in the slot and reads only the workspace. Its reward is shaped, each
step a thing a small model can change:

    1.0   the file holds exactly the word (a trailing newline allowed)
    0.5   the file exists with something else in it
    0.25  some other file was written (a well-formed call to the wrong place)
    0.0   nothing was written

Config: `examples` (0-2, default 2) worked examples before the task.
"""

from __future__ import annotations

import json
import shlex
from typing import Any

from envs.base import Env, SlotHandle
from envs.registry import register_env
from envs.write_word.tasks import EXAMPLES, WriteWordTask, all_tasks, worked_examples
from temporal_rollouts.core.errors import BadItem, ConfigError, TaskError
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall
from temporal_rollouts.core.tasks import Item, ScriptedCall, Verdict

SYSTEM_PROMPT = "You work in a Linux sandbox. You solve tasks by calling tools."
REWARD_BY_EXIT = {0: 1.0, 10: 0.5, 11: 0.25, 12: 0.0}
"""The check's exit code -> reward (any other exit is a broken check, not a score)."""
CHECK = """\
target={path}
if [ -f "$target" ] && [ ! -L "$target" ]; then
    content=$(head -c 4096 -- "$target"; printf x)
    content=${{content%x}}
    if [ "$content" = {word} ] || [ "$content" = {word_newline} ]; then exit 0; fi
    exit 10
fi
if [ -n "$(find . -mindepth 1 -type f -print -quit)" ]; then exit 11; fi
exit 12
"""
CHECK_TIMEOUT_S = 30.0


@register_env
class WriteWordEnv(Env):
    """Items are `<file>-<word>` ids of `tasks.all_tasks()`; see the module docstring for the reward."""

    name = "write_word"
    tool_names = ("write_file",)

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        examples = self.config.get("examples", len(EXAMPLES))
        if isinstance(examples, bool) or not isinstance(examples, int) or not 0 <= examples <= len(EXAMPLES):
            raise ConfigError(f"write_word: `examples` must be an integer from 0 to {len(EXAMPLES)}, got {examples!r}")
        self.examples = worked_examples(examples)
        self.tasks = {task.id: task for task in all_tasks()}

    def task(self, item: Item) -> WriteWordTask:
        try:
            return self.tasks[item.id]
        except KeyError:
            raise BadItem(f"write_word has no task {item.id!r} (ids are <file>-<word>, e.g. answer-apple)") from None

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        ids = list(self.tasks)
        return [Item(id=ids[(offset + i) % len(ids)]) for i in range(count)]

    def item_count(self) -> int | None:
        return len(self.tasks)

    def system_prompt(self) -> str | None:
        return SYSTEM_PROMPT

    def format_prompt(self, item: Item) -> str:
        return self.task(item).request()

    def prompt_messages(self, item: Item) -> list[Message]:
        system, task = super().prompt_messages(item)
        shown = []
        for index, example in enumerate(self.examples):
            arguments = json.dumps({"path": example.path, "content": example.word})
            call = ToolCall(id=f"call_example_{index}", function=FunctionCall(name="write_file", arguments=arguments))
            shown += [Message(role="user", content=example.request()), Message(role="assistant", tool_calls=[call])]
        return [system, *shown, task]

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        task = self.task(item)
        script = CHECK.format(
            path=shlex.quote(task.path), word=shlex.quote(task.word), word_newline=shlex.quote(task.word + "\n")
        )
        result = await slot.exec("check", script, timeout_s=CHECK_TIMEOUT_S)
        if result.timed_out or result.exit_code not in REWARD_BY_EXIT:
            raise TaskError(f"write_word's check failed to run (exit {result.exit_code}): {result.output[-500:]}")
        return Verdict(score=REWARD_BY_EXIT[result.exit_code], details={"task": task.id, "exit_code": result.exit_code})

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        task = self.task(item)
        return [[ScriptedCall(name="write_file", arguments={"path": task.path, "content": task.word})]]
