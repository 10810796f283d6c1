"""The `echo_chain` env: a do-nothing task of a set number of turns, for benchmarks.

Each item asks for `steps` turns of one `echo step-k` terminal call, so a run
measures the machinery (model calls, tool calls, checkpoints), not the task.
"""

from __future__ import annotations

import re
from typing import Any

from envs.base import Env, Item, ScriptedCall, SlotHandle, Verdict
from envs.registry import register_env
from rollouts.errors import BadItem, ConfigError
from rollouts.messages import Message

DEFAULT_STEPS = 3
ITEM_ID = re.compile(r"^echo-(\d+)$")
PROMPT_HEADER = re.compile(r"^Task (echo-\d+): run these commands", re.MULTILINE)
PROMPT_STEP = re.compile(r"^\d+\. (echo step-\d+)$", re.MULTILINE)


@register_env
class EchoChainEnv(Env):
    """Items `echo-<n>` for any n; config `steps` (default 3) sets the number of turns."""

    name = "echo_chain"
    tool_names = ("terminal",)

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        super().__init__(config)
        steps = self.config.get("steps", DEFAULT_STEPS)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ConfigError(f"echo_chain: `steps` must be a positive integer, got {steps!r}")
        self.steps = steps

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        return [Item(id=f"echo-{offset + i}", data={"steps": self.steps}) for i in range(count)]

    def item_steps(self, item: Item) -> int:
        if not ITEM_ID.match(item.id):
            raise BadItem(f"echo_chain items are named echo-<n>, not {item.id!r}")
        steps = item.data.get("steps", self.steps)
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise BadItem(f"echo_chain item {item.id!r} has a bad step count {steps!r}")
        return steps

    def system_prompt(self) -> str | None:
        return "You work in a Linux sandbox at /workspace. Call the terminal tool as asked, then stop calling tools."

    def format_prompt(self, item: Item) -> str:
        steps = self.item_steps(item)
        lines = [f"Task {item.id}: run these commands with the terminal tool, exactly one call per turn, in order:"]
        lines += [f"{k}. echo step-{k}" for k in range(1, steps + 1)]
        lines.append("When all of them have run, reply without calling a tool.")
        return "\n".join(lines)

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        steps = self.item_steps(item)
        result = await slot.exec("check", "test -d /workspace", timeout_s=10.0)
        tool_calls = sum(len(m.tool_calls or []) for m in transcript if m.role == "assistant")
        return Verdict(
            score=1.0 if result.exit_code == 0 else 0.0,
            details={"steps": steps, "tool_calls": tool_calls, "exit_code": result.exit_code},
        )

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        return _echo_turns(range(1, self.item_steps(item) + 1))

    def solution_for_prompt(self, prompt: str) -> list[list[ScriptedCall]] | None:
        """The solution read back from a prompt of any step count (used by the demo policy)."""
        if not PROMPT_HEADER.match(prompt):
            return None
        commands = PROMPT_STEP.findall(prompt)
        return [[ScriptedCall(name="terminal", arguments={"command": command})] for command in commands] or None


def _echo_turns(steps: range) -> list[list[ScriptedCall]]:
    return [[ScriptedCall(name="terminal", arguments={"command": f"echo step-{k}"})] for k in steps]
