"""`add_numbers`: a small env that lives outside temporal-rollouts, as yours will.

The model finds `numbers.txt` in its workspace and must write the numbers' sum to
`answer.txt`; a check in the same sandbox scores it. docs/write-an-env.md walks through it.
"""

from __future__ import annotations

import random
from typing import Any

from envs.base import Env, Item, ScriptedCall, SlotHandle, Verdict
from envs.registry import register_env
from temporal_rollouts.core.errors import TaskError
from temporal_rollouts.core.messages import Message

ITEMS = 20


@register_env
class AddNumbersEnv(Env):
    name = "add_numbers"
    tool_names = ("terminal", "read_file", "write_file")
    sandbox_limits = {"memory_limit_mb": 256, "max_processes": 32, "cpu_time_limit_s": 30}

    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        return [self.item(index % ITEMS) for index in range(offset, offset + count)]

    def item_count(self) -> int | None:
        return ITEMS

    @staticmethod
    def item(index: int) -> Item:
        rng = random.Random(index)
        numbers = [rng.randint(1, 999) for _ in range(rng.randint(3, 8))]
        return Item(id=f"add-{index}", data={"numbers": numbers})

    def system_prompt(self) -> str | None:
        return "You work in a Linux sandbox, in /workspace. Use the tools to do the task, then stop calling them."

    def format_prompt(self, item: Item) -> str:
        count = len(item.data["numbers"])
        return (
            f"Task {item.id}: numbers.txt holds {count} whole numbers, one per line. "
            "Write their sum to answer.txt, and nothing else."
        )

    async def setup_workspace(self, item: Item, slot: SlotHandle) -> dict[str, Any]:
        text = "".join(f"{number}\n" for number in item.data["numbers"])
        await slot.write_file("numbers.txt", text, key="numbers")
        return {}

    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        expected = sum(item.data["numbers"])
        check = f'[ -f answer.txt ] && [ "$(head -c 100 answer.txt | tr -d "[:space:]")" = "{expected}" ]'
        result = await slot.terminal(check, timeout=30, key="check")
        if result.timed_out or result.exit_code not in (0, 1):
            raise TaskError(f"add_numbers' check did not run (exit {result.exit_code}): {result.output[-300:]}")
        return Verdict(score=1.0 if result.exit_code == 0 else 0.0, details={"expected": expected})

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        add_up = "awk '{s += $1} END {print s}' numbers.txt > answer.txt"
        return [
            [ScriptedCall(name="read_file", arguments={"path": "numbers.txt"})],
            [ScriptedCall(name="terminal", arguments={"command": add_up})],
        ]
