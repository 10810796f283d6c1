"""Meituan LongCat-Flash tool calls: Hermes JSON in `<longcat_tool_call>` tags.

LongCat-Flash-Chat and -Thinking write one JSON object per call:

    <longcat_tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </longcat_tool_call>

LongCat-Flash-Lite writes GLM-style key/value tags inside the same wrapper:

    <longcat_tool_call>get_weather
    <longcat_arg_key>city</longcat_arg_key>
    <longcat_arg_value>Paris</longcat_arg_value>
    </longcat_tool_call>

Both are read (a block that starts with `{` is JSON, anything else is tags,
typed as in `llm.parsers.glm`). Content is the text before the first
`<longcat_tool_call>`; reasoning is `<longcat_think>...</longcat_think>` or
`<think>...</think>`; the end-of-sequence token `</longcat_s>` is ignored when
it trails. A missing close tag is tolerated as in the Hermes parser.
"""

from __future__ import annotations

from temporal_rollouts.llm.parsers.base import register_parser
from temporal_rollouts.llm.parsers.glm import Glm45Parser

OPEN = "<longcat_tool_call>"
CLOSE = "</longcat_tool_call>"


@register_parser("longcat", "longcat_flash")
class LongcatParser(Glm45Parser):
    call_open = OPEN
    call_close = CLOSE
    key_open = "<longcat_arg_key>"
    key_close = "</longcat_arg_key>"
    value_open = "<longcat_arg_value>"
    value_close = "</longcat_arg_value>"
    stop_markers = ("</longcat_s>",)
    reasoning_tags = (("<longcat_think>", "</longcat_think>"), ("<think>", "</think>"))
    call_markers = (OPEN,)
