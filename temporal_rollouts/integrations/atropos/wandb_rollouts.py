"""Trajectories as the rollout table of Weights & Biases shows them.

atroposlib's own `add_rollouts_for_wandb` decodes each rollout's token ids, which a chat
policy does not have and which hide the tool calls in template markup. The system we
replace rendered the conversation instead, cutting reasoning to 300 characters, tool
arguments to 200 and tool results to 500 (SEEDS.md, wandb); so does this.
"""

from __future__ import annotations

from typing import Any

REASONING_CHARS = 300
ARGUMENT_CHARS = 200
RESULT_CHARS = 500


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"... [{len(text) - limit} more]"


def format_trajectory(messages: list[dict[str, Any]]) -> str:
    """One rollout's conversation as plain text for a wandb table cell."""
    lines: list[str] = []
    for message in messages:
        role = message.get("role", "?")
        if message.get("reasoning_content"):
            lines.append(f"[{role} reasoning] {_cut(message['reasoning_content'], REASONING_CHARS)}")
        content = message.get("content") or ""
        if role == "tool":
            lines.append(f"[tool result] {_cut(content, RESULT_CHARS)}")
        elif content:
            lines.append(f"[{role}] {content}")
        for call in message.get("tool_calls") or []:
            function = call.get("function", {})
            lines.append(f"[tool call] {function.get('name')}({_cut(function.get('arguments', ''), ARGUMENT_CHARS)})")
    return "\n".join(lines)


def rollouts_for_table(group: dict[str, Any], keep: int) -> list[tuple[str, float]]:
    """(text, score) for the first `keep` rollouts of a scored group (all when keep is -1)."""
    messages, scores = group.get("messages") or [], group.get("scores") or []
    count = len(scores) if keep == -1 else min(keep, len(scores))
    return [(format_trajectory(messages[i] if i < len(messages) else []), scores[i]) for i in range(count)]
