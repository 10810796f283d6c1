"""Tool-call parsers: rebuild OpenAI-style `tool_calls` from a model's raw generated text.

    parser = get_parser("hermes")           # or qwen, qwen3_coder, llama3_json, mistral, deepseek_v3, ...
    turn = parser.parse(generated_text)      # ParsedTurn(content, tool_calls, reasoning)
    message = turn.to_message()              # a rollouts.messages.Message for the transcript

`get_parser(name, tools=[...])` passes the tools' schemas to parsers that type
bare-text values (qwen3_coder). An unknown name raises ConfigError listing the
known ones. New families register with `@register_parser("name", *aliases)` on a
`ToolCallParser` subclass. See `llm.parsers.base` for the rules every parser keeps.
"""

from __future__ import annotations

from temporal_rollouts.llm.parsers import (  # noqa: F401  (registers the families)
    deepseek,
    glm,
    hermes,
    kimi,
    llama,
    llama4,
    longcat,
    mistral,
    qwen3_coder,
)
from temporal_rollouts.llm.parsers.base import (
    ParsedTurn,
    RawCall,
    ToolCallParser,
    get_parser,
    make_call_id,
    parser_names,
    register_parser,
)

__all__ = [
    "ParsedTurn",
    "RawCall",
    "ToolCallParser",
    "get_parser",
    "make_call_id",
    "parser_names",
    "register_parser",
]
