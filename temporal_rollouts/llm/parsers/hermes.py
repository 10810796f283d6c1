"""Hermes-style calls: a JSON object per `<tool_call>...</tool_call>` block.

    Let me look.
    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

Used by NousResearch Hermes 2 Pro / 3 and by Qwen2.5 and Qwen3 (whose templates
render exactly this), so `qwen`, `qwen2_5` and `qwen3` are aliases. Qwen3 thinks
first in `<think>...</think>`, which becomes the reasoning.

The content is the text before the first `<tool_call>`. The last block may be
unclosed (generation stopped on `</tool_call>` as a stop string, or ran out of
tokens). A block may hold several objects or a JSON list of them.
"""

from __future__ import annotations

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    calls_from_json_text,
    register_parser,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


def tool_call_blocks(text: str) -> tuple[str, list[str]] | None:
    """(text before the first block, the body of each block), or None without any block.

    A block ends at its close tag, at the next open tag, or at the end of the text."""
    start = text.find(OPEN)
    if start == -1:
        return None
    bodies: list[str] = []
    pos = start
    while pos != -1:
        body_start = pos + len(OPEN)
        close = text.find(CLOSE, body_start)
        following = text.find(OPEN, body_start)
        if close == -1 or (following != -1 and following < close):
            end = following if following != -1 else len(text)
            after = end
        else:
            end = close
            after = close + len(CLOSE)
        bodies.append(text[body_start:end])
        pos = text.find(OPEN, after)
    return text[:start], bodies


@register_parser("hermes", "qwen", "qwen2_5", "qwen3")
class HermesParser(ToolCallParser):
    call_markers = (OPEN,)

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        found = tool_call_blocks(text)
        if found is None:
            return text, []
        content, bodies = found
        calls: list[RawCall] = []
        for body in bodies:
            if body.strip():
                calls.extend(calls_from_json_text(body))
        return content, calls
