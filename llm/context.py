"""Cheap, deterministic context-size estimates, usable inside workflow code."""

from __future__ import annotations

from collections.abc import Iterable

from rollouts.messages import Message

CHARS_PER_TOKEN = 4
PER_MESSAGE_TOKENS = 10
PER_TOOL_CALL_TOKENS = 50


def estimate_tokens(messages: Iterable[Message]) -> int:
    """The original system's estimate: len(content)//4 + 10 per message, +50 per tool call."""
    total = 0
    for message in messages:
        text = (message.content or "") + (message.reasoning_content or "")
        total += len(text) // CHARS_PER_TOKEN + PER_MESSAGE_TOKENS
        for call in message.tool_calls or []:
            total += PER_TOOL_CALL_TOKENS + len(call.function.arguments) // CHARS_PER_TOKEN
    return total
