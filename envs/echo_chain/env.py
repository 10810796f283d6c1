"""The `echo_chain` env: a trivial task of a set number of turns, for benchmarks and crash tests.

Each item asks for `steps` turns of one terminal call that appends `step-k` to
chain.log, so a run measures the machinery (model calls, tool calls, checkpoints),
not the task. The verifier demands each step exactly once and in order: a tool call
executed twice scores 0. Config `sleep_s`, `setup_sleep_s` and `verify_sleep_s`
stretch the tool calls, setup and verification, so tests can crash a worker mid-step;
`output_chars` makes each call print that many more characters (long contexts);
`stamp` makes each call also print the time in nanoseconds, so no two runs of it answer
alike (a fork that replays them diverges); `ballast_kb` has setup write that many KB of
random bytes into the workspace, so snapshots and copies of it cost what a real one would.
"""

from __future__ import annotations

import re
from typing import Any

from envs.base import Env, SlotHandle
from envs.registry import register_env
from temporal_rollouts.core.errors import BadItem, ConfigError
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.tasks import Item, ScriptedCall, Verdict

DEFAULT_STEPS = 3
ITEM_ID = re.compile(r"^echo-(\d+)$")
PROMPT_HEADER = re.compile(r"^Task (echo-\d+): run these commands", re.MULTILINE)
PROMPT_STEP = re.compile(r"^\d+\. (.+)$", re.MULTILINE)
LOG = "chain.log"


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
        self.sleep_s = _seconds(self.config, "sleep_s")
        self.setup_sleep_s = _seconds(self.config, "setup_sleep_s")
        self.verify_sleep_s = _seconds(self.config, "verify_sleep_s")
        self.output_chars = int(_seconds(self.config, "output_chars"))
        self.stamp = bool(self.config.get("stamp", False))
        self.ballast_kb = int(_seconds(self.config, "ballast_kb"))

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
        lines += [f"{k}. {self.command(k)}" for k in range(1, steps + 1)]
        lines.append("When all of them have run, reply without calling a tool.")
        return "\n".join(lines)

    def command(self, step: int) -> str:
        command = f"echo step-{step} | tee -a {LOG}"
        if self.output_chars:
            command += f"; head -c {self.output_chars} /dev/zero | tr '\\0' x"
        if self.stamp:
            command += "; date +%s%N"
        return f"sleep {self.sleep_s:g}; {command}" if self.sleep_s else command

    async def setup_workspace(self, item: Item, slot: SlotHandle) -> dict[str, Any]:
        if self.setup_sleep_s:
            await slot.exec("sleep", f"sleep {self.setup_sleep_s:g}", timeout_s=self.setup_sleep_s + 30)
        if self.ballast_kb:
            await slot.exec("ballast", f"head -c {self.ballast_kb * 1024} /dev/urandom > ballast.bin", timeout_s=120)
        return {}

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        steps = self.item_steps(item)
        expected = "".join(f"step-{k}\\n" for k in range(1, steps + 1))
        check = f'test "$(cat {LOG} 2>/dev/null)" = "$(printf \'{expected}\')"'
        if self.verify_sleep_s:
            check = f"sleep {self.verify_sleep_s:g}; {check}"
        result = await slot.exec("check", check, timeout_s=self.verify_sleep_s + 30)
        tool_calls = sum(len(m.tool_calls or []) for m in transcript if m.role == "assistant")
        return Verdict(
            score=1.0 if result.exit_code == 0 and not result.timed_out else 0.0,
            details={"steps": steps, "tool_calls": tool_calls, "exit_code": result.exit_code},
        )

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        return [
            [ScriptedCall(name="terminal", arguments={"command": self.command(k)})]
            for k in range(1, self.item_steps(item) + 1)
        ]

    def solution_for_prompt(self, prompt: str) -> list[list[ScriptedCall]] | None:
        """The solution read back from a prompt of any step count (used by the demo policy)."""
        if not PROMPT_HEADER.match(prompt):
            return None
        commands = PROMPT_STEP.findall(prompt)
        return [[ScriptedCall(name="terminal", arguments={"command": command})] for command in commands] or None


def _seconds(config: dict[str, Any], key: str) -> float:
    value = config.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"echo_chain: `{key}` must be a non-negative number of seconds, got {value!r}")
    return float(value)
