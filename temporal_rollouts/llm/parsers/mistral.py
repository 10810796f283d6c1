"""Mistral tool calls, both generations of the format.

Tokenizers v2 to v7 (Mistral 7B v0.3, Mixtral 8x22B, Nemo, Small 3.0/3.1):

    [TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abc123XYZ"}]

Tokenizers v11 and later (Small 3.2, Magistral, Devstral, Medium 3): one
`[TOOL_CALLS]` per call, the id only in v11:

    [TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{"city": "Paris"}

Content is the text before the first `[TOOL_CALLS]`; reasoning is
`[THINK]...[/THINK]` (Magistral), or `<think>...</think>`. The ids the model
writes are not kept: every parser hands out `call_<8 hex>` ids.
`[TOOL_CALLS]` and `[ARGS]` are special tokens: decode with them kept.
"""

from __future__ import annotations

import re

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    arguments_from_text,
    calls_from_json_text,
    decode_prefix,
    register_parser,
)

TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
_NAME_THEN_JSON = re.compile(r"^\s*([^\s{\[]+)\s*(\{.*)$", re.DOTALL)


@register_parser("mistral")
class MistralParser(ToolCallParser):
    reasoning_tags = (("[THINK]", "[/THINK]"), ("<think>", "</think>"))
    call_markers = (TOOL_CALLS,)

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        start = text.find(TOOL_CALLS)
        if start == -1:
            return text, []
        calls: list[RawCall] = []
        for segment in text[start:].split(TOOL_CALLS)[1:]:
            body = segment.strip()
            if not body:
                continue
            if body[0] in "[{":
                calls.extend(calls_from_json_text(body))
            else:
                calls.append(_named_call(body))
        return text[:start], calls


def _named_call(body: str) -> RawCall:
    """`name[CALL_ID]id[ARGS]{...}`, `name[ARGS]{...}`, or leniently `name{...}`."""
    if ARGS in body:
        head, raw_args = body.split(ARGS, 1)
        name = head.split(CALL_ID, 1)[0].strip()
        return RawCall(name, _arguments(raw_args))
    match = _NAME_THEN_JSON.match(body)
    if match:
        return RawCall(match.group(1).split(CALL_ID, 1)[0], _arguments(match.group(2)))
    return RawCall(body.split(CALL_ID, 1)[0].strip(), "{}")


def _arguments(raw: str) -> str:
    """The JSON object after [ARGS]; text the model wrote after a complete object is ignored."""
    try:
        _, end = decode_prefix(raw)
    except ValueError:
        return arguments_from_text(raw)
    return arguments_from_text(raw[:end])
