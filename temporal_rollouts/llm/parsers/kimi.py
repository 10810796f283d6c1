"""Moonshot Kimi-K2 tool calls, between Kimi's special tokens:

    Let me check.<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Paris"}<|tool_call_end|><|tool_call_begin|>functions.search:1<|tool_call_argument_begin|>{...}<|tool_call_end|><|tool_calls_section_end|><|im_end|>

Each call is headed by an id `functions.<name>:<index>`; the name is what is
left after removing the `functions.` prefix and the `:<index>` suffix (a bare
`<name>:<index>` or `<name>` is read too). The arguments are JSON text; the
early Kimi-K2 template `tojson`s an already-serialised OpenAI argument string,
which base.arguments_from_text decodes once. The ids the model writes are not
kept: every parser hands out `call_<8 hex>` ids.

Content is the text before the first section (or call) token; text after the
section is dropped. Kimi-K2-Thinking reasons in `<think>...</think>`. The
section token is also accepted in the singular (`<|tool_call_section_begin|>`)
that some Kimi checkpoints emit. Missing end tokens are tolerated: the last
call then runs to the end of the text. These are special tokens: decode with
special tokens kept.
"""

from __future__ import annotations

import re

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    arguments_from_text,
    register_parser,
)

SECTION_BEGIN = "<|tool_calls_section_begin|>"
SECTION_END = "<|tool_calls_section_end|>"
SECTION_BEGIN_VARIANTS = (SECTION_BEGIN, "<|tool_call_section_begin|>")
SECTION_END_VARIANTS = (SECTION_END, "<|tool_call_section_end|>")
CALL_BEGIN = "<|tool_call_begin|>"
ARGUMENT_BEGIN = "<|tool_call_argument_begin|>"
CALL_END = "<|tool_call_end|>"

_INDEX_SUFFIX = re.compile(r":\s*\d+\s*$")


@register_parser("kimi_k2", "kimi")
class KimiK2Parser(ToolCallParser):
    call_markers = (*SECTION_BEGIN_VARIANTS, CALL_BEGIN)

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        starts = [pos for pos in (text.find(marker) for marker in self.call_markers) if pos != -1]
        if not starts:
            return text, []
        first = min(starts)
        region = text[first:]
        for marker in SECTION_BEGIN_VARIANTS:
            region = region.replace(marker, "")
        ends = [pos for pos in (region.find(marker) for marker in SECTION_END_VARIANTS) if pos != -1]
        if ends:
            region = region[: min(ends)]
        head, *rest = region.split(CALL_BEGIN)
        # Before the first call token there is normally nothing; text there is a call
        # whose begin token is missing only if it has arguments or no call follows.
        chunks = [head, *rest] if ARGUMENT_BEGIN in head or not rest else rest
        calls: list[RawCall] = []
        for chunk in chunks:
            body = chunk.split(CALL_END, 1)[0]
            if body.strip():
                calls.append(_call(body))
        return text[:first], calls


def _call(body: str) -> RawCall:
    if ARGUMENT_BEGIN in body:
        head, raw_args = body.split(ARGUMENT_BEGIN, 1)
    else:  # the argument token is missing: the arguments start at the first brace, if any
        brace = body.find("{")
        head, raw_args = (body, "") if brace == -1 else (body[:brace], body[brace:])
    name = function_name(head)
    if not name:
        return RawCall("", body.strip())
    return RawCall(name, arguments_from_text(raw_args))


def function_name(call_id: str) -> str:
    """`functions.get_weather:0` -> `get_weather`; `get_weather:0` and `get_weather` are kept as names."""
    name = _INDEX_SUFFIX.sub("", call_id.strip())
    name = name.removeprefix("functions.")
    return name.strip()
