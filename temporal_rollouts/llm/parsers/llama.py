"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: the whole message is the call.

    {"name": "get_weather", "parameters": {"city": "Paris"}}

optionally after `<|python_tag|>`, several separated by `;`. The Llama 3.1
template also renders built-in tools as `<|python_tag|>brave_search.call(query="...")`,
which is parsed into the same shape.

A message is a tool call only when it starts (after the optional tag) with a
JSON object that has "name" and "parameters" (or "arguments"); an ordinary
answer that happens to be JSON, or text, is content. Text before
`<|python_tag|>` and text after the calls is content too.
"""

from __future__ import annotations

import ast
import re

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    call_from_object,
    compact_json,
    decode_prefix,
    register_parser,
    salvage_call,
)

PYTHON_TAG = "<|python_tag|>"
_CALL_START = re.compile(r'\{\s*"name"\s*:')
_BUILTIN_CALL = re.compile(r"^\s*([A-Za-z_][\w.]*?)\.call\((.*)\)\s*$", re.DOTALL)
_ARGS_KEYS = ("parameters", "arguments")


@register_parser("llama3_json", "llama3", "llama")
class Llama3JsonParser(ToolCallParser):
    reasoning_tags = ()
    call_markers = (PYTHON_TAG,)

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        tag = text.find(PYTHON_TAG)
        before, body = (text[:tag], text[tag + len(PYTHON_TAG) :]) if tag != -1 else ("", text)
        calls, rest = _json_calls(body)
        if calls:
            return _join(before, rest), calls
        if tag != -1:
            builtin = _builtin_call(body)
            if builtin is not None:
                return before, [builtin]
        if _CALL_START.match(body.lstrip()) and not _decodes(body):
            return before, [salvage_call(body, args_keys=_ARGS_KEYS)]
        return text, []


def _json_calls(body: str) -> tuple[list[RawCall], str]:
    """Leading call objects separated by ';', and the text left after them."""
    calls: list[RawCall] = []
    pos = 0
    while True:
        while pos < len(body) and (body[pos].isspace() or body[pos] == ";"):
            pos += 1
        if pos >= len(body):
            return calls, ""
        if body[pos] != "{":
            return calls, body[pos:]
        try:
            value, end = decode_prefix(body, pos)
        except ValueError:
            if calls and _CALL_START.match(body, pos):
                calls.append(salvage_call(body[pos:], args_keys=_ARGS_KEYS))
                return calls, ""
            return calls, body[pos:]
        if not _is_call(value):
            return calls, body[pos:]
        calls.append(call_from_object(value, args_keys=_ARGS_KEYS))
        pos = end


def _decodes(body: str) -> bool:
    try:
        decode_prefix(body)
    except ValueError:
        return False
    return True


def _is_call(value: object) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str) and any(k in value for k in _ARGS_KEYS)


def _builtin_call(body: str) -> RawCall | None:
    match = _BUILTIN_CALL.match(body)
    if match is None:
        return None
    name, inner = match.group(1), match.group(2)
    raw = RawCall(name, inner.strip())
    try:
        call = ast.parse(f"f({inner})", mode="eval").body
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return raw
    if not isinstance(call, ast.Call) or call.args or any(kw.arg is None for kw in call.keywords):
        return raw
    try:
        arguments = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return raw
    try:
        return RawCall(name, compact_json(arguments))
    except (TypeError, ValueError):  # a literal JSON cannot hold (a set, bytes, inf): keep the raw text
        return raw


def _join(*parts: str) -> str:
    return "\n".join(part.strip() for part in parts if part.strip())
