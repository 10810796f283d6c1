"""Llama 4 JSON tool calls, as the Llama 4 chat template renders them:

    <|python_start|>Let me look.<|python_end|>{"name": "get_weather", "parameters": {"city": "Paris"}}{"name": "search", "parameters": {...}}<|eot|>

The template wraps the message's text in `<|python_start|>...<|python_end|>`
and writes the calls after it as `{"name", "parameters"}` objects with nothing
between them. A Llama 4 model may also put the calls themselves inside the
block, as JSON or as Meta's pythonic list `[get_weather(city="Paris"), ...]`;
both are read. Without `<|python_start|>` the text is read exactly as
llama3_json reads it (bare JSON objects, `;`-separated, `<|python_tag|>`).

Inside and after the block, what is not a call is content (text before the
block too), so an ordinary answer stays content. A missing `<|python_end|>`
(generation cut off) makes the rest of the text the block's inside; a call
object cut off there is salvaged as llama3_json salvages one. The end-of-turn
tokens `<|eot|>` and `<|eom|>` are ignored when they trail. The block tokens
are special tokens: decode with special tokens kept.
"""

from __future__ import annotations

import ast

from temporal_rollouts.llm.parsers.base import RawCall, compact_json, register_parser
from temporal_rollouts.llm.parsers.glm import strip_trailing
from temporal_rollouts.llm.parsers.llama import Llama3JsonParser, _join

PYTHON_START = "<|python_start|>"
PYTHON_END = "<|python_end|>"
END_OF_TURN = ("<|eot|>", "<|eom|>")


@register_parser("llama4_json", "llama4")
class Llama4JsonParser(Llama3JsonParser):
    call_markers = (PYTHON_START, *Llama3JsonParser.call_markers)

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        return super().split_reasoning(strip_trailing(text, END_OF_TURN))

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        start = text.find(PYTHON_START)
        if start == -1:
            return super().extract(text)
        inside = text[start + len(PYTHON_START) :]
        end = inside.find(PYTHON_END)
        inner, after = (inside, "") if end == -1 else (inside[:end], inside[end + len(PYTHON_END) :])
        parts = [text[:start]]
        calls = pythonic_calls(inner)
        if calls is None:
            inner_content, calls = super().extract(inner)
            parts.append(inner_content or "")
        if after.strip():
            after_content, after_calls = super().extract(after)
            calls = [*calls, *after_calls]
            parts.append(after_content or "")
        return _join(*parts), calls


def pythonic_calls(text: str) -> list[RawCall] | None:
    """Calls from `[name(key=literal, ...), ...]`, or None if the text is not such a list."""
    body = text.strip()
    if not (body.startswith("[") and body.endswith("]")):
        return None
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return None
    if not isinstance(tree, ast.List) or not tree.elts:
        return None
    calls: list[RawCall] = []
    for call in tree.elts:
        if not isinstance(call, ast.Call):
            return None
        name = _dotted_name(call.func)
        if name is None or call.args or any(kw.arg is None for kw in call.keywords):
            return None
        try:
            arguments = compact_json({kw.arg: ast.literal_eval(kw.value) for kw in call.keywords})
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            # a variable, an expression or a set as a value: keep the call's own text for the tool to reject
            arguments = ast.get_source_segment(body, call) or ""
        calls.append(RawCall(name, arguments))
    return calls


def _dotted_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        owner = _dotted_name(node.value)
        return None if owner is None else f"{owner}.{node.attr}"
    return None
