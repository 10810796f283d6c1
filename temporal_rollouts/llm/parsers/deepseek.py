"""DeepSeek tool calls, between DeepSeek's own special tokens.

DeepSeek-V3 (and R1-0528), as its chat template renders them:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather
    ```json
    {"city": "Paris"}
    ```<｜tool▁call▁end｜>
    <｜tool▁call▁begin｜>function<｜tool▁sep｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>

DeepSeek-V3.1 drops the type and the code fence:

    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>

One parser reads both (registered as `deepseek_v3` and `deepseek_v31`). The
delimiters use U+FF5C (｜) and U+2581 (▁), not ASCII; they are special tokens,
so decode with special tokens kept. Content is the text before the first
delimiter; `<think>...</think>` (R1, V3.1 thinking mode) is the reasoning.
Missing end delimiters are tolerated.
"""

from __future__ import annotations

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    arguments_from_text,
    register_parser,
    salvage_call,
)

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
SEP = "<｜tool▁sep｜>"
CALL_TYPES = ("function",)


@register_parser("deepseek_v3", "deepseek_v31", "deepseek")
class DeepSeekParser(ToolCallParser):
    call_markers = (CALLS_BEGIN, CALL_BEGIN)

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        starts = [pos for pos in (text.find(CALLS_BEGIN), text.find(CALL_BEGIN)) if pos != -1]
        if not starts:
            return text, []
        first = min(starts)
        region = text[first:].replace(CALLS_BEGIN, "")
        end = region.find(CALLS_END)
        if end != -1:
            region = region[:end]
        calls: list[RawCall] = []
        for chunk in region.split(CALL_BEGIN)[1:]:
            body = chunk.split(CALL_END, 1)[0]
            if body.strip():
                calls.append(_call(body))
        return text[:first], calls


def _call(body: str) -> RawCall:
    if SEP not in body:
        return salvage_call(body)
    head, tail = body.split(SEP, 1)
    head = head.strip()
    if head in CALL_TYPES and not tail.lstrip().startswith("{"):
        # V3: type<sep>name\n```json\n{...}\n```
        name, _, raw_args = tail.lstrip().partition("\n")
        return RawCall(name.strip(), arguments_from_text(raw_args))
    # V3.1: name<sep>{...}
    return RawCall(head, arguments_from_text(tail))
