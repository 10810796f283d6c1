"""Qwen3-Coder's XML-ish calls, also rendered by the Qwen3.5 / Qwen3.6 templates:

    <tool_call>
    <function=write_file>
    <parameter=path>
    notes.txt
    </parameter>
    <parameter=overwrite>
    true
    </parameter>
    </function>
    </tool_call>

Parameter values are bare text. The template puts one newline on each side,
which is removed (any further whitespace belongs to the value). Values are then
typed: with the tool's JSON schema (parsers built with `tools=`) by the declared
type; without one, a value that parses as a JSON number, boolean, null, object
or array becomes that, and anything else stays a string.

Tolerated: missing `</parameter>`, `</function>` or `</tool_call>` (the text
ends, or the next parameter / function starts); `<function=...>` without a
`<tool_call>` wrapper; a Hermes JSON object inside `<tool_call>` instead of XML.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    calls_from_json_text,
    compact_json,
    loads_strict,
    register_parser,
)
from temporal_rollouts.llm.parsers.hermes import CLOSE as TOOL_CALL_CLOSE
from temporal_rollouts.llm.parsers.hermes import OPEN as TOOL_CALL_OPEN

FUNCTION_TAG = re.compile(r"<function=([^>\n]*)>")
PARAMETER_TAG = re.compile(r"<parameter=([^>\n]*)>")
FUNCTION_CLOSE = "</function>"
PARAMETER_CLOSE = "</parameter>"

_NO_VALUE = object()


@register_parser("qwen3_coder", "qwen3_xml")
class Qwen3CoderParser(ToolCallParser):
    call_markers = (TOOL_CALL_OPEN, "<function=")

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        starts = [pos for pos in (text.find(TOOL_CALL_OPEN), _find(FUNCTION_TAG, text)) if pos != -1]
        if not starts:
            return text, []
        first = min(starts)
        calls: list[RawCall] = []
        for chunk in text[first:].split(TOOL_CALL_OPEN):
            close = chunk.find(TOOL_CALL_CLOSE)
            block, after = (chunk, "") if close == -1 else (chunk[:close], chunk[close + len(TOOL_CALL_CLOSE) :])
            if FUNCTION_TAG.search(block):
                calls.extend(self._functions(block))
            elif block.strip():
                calls.extend(calls_from_json_text(block))
            if FUNCTION_TAG.search(after):  # a function the model wrote without its <tool_call> wrapper
                calls.extend(self._functions(after))
        return text[:first], calls

    def _functions(self, block: str) -> list[RawCall]:
        tags = list(FUNCTION_TAG.finditer(block))
        calls = []
        for index, tag in enumerate(tags):
            end = tags[index + 1].start() if index + 1 < len(tags) else len(block)
            body = block[tag.end() : end]
            close = body.find(FUNCTION_CLOSE)
            if close != -1:
                body = body[:close]
            name = tag.group(1).strip()
            calls.append(RawCall(name, compact_json(self._parameters(name, body))))
        return calls

    def _parameters(self, function: str, body: str) -> dict[str, Any]:
        properties = self.tool_schemas.get(function, {}).get("properties")
        properties = properties if isinstance(properties, dict) else {}
        tags = list(PARAMETER_TAG.finditer(body))
        values: dict[str, Any] = {}
        for index, tag in enumerate(tags):
            end = tags[index + 1].start() if index + 1 < len(tags) else len(body)
            raw = body[tag.end() : end]
            close = raw.find(PARAMETER_CLOSE)
            if close != -1:
                raw = raw[:close]
            raw = _strip_one_newline(raw)
            name = tag.group(1).strip()
            schema = properties.get(name)
            values[name] = typed_value(raw, schema if isinstance(schema, dict) else None)
        return values


def _find(pattern: re.Pattern[str], text: str) -> int:
    match = pattern.search(text)
    return match.start() if match else -1


def _strip_one_newline(raw: str) -> str:
    if raw.startswith("\r\n"):
        raw = raw[2:]
    elif raw.startswith("\n"):
        raw = raw[1:]
    if raw.endswith("\r\n"):
        raw = raw[:-2]
    elif raw.endswith("\n"):
        raw = raw[:-1]
    return raw


def typed_value(raw: str, schema: dict[str, Any] | None) -> Any:
    """A parameter's text as the value its schema (or, without one, its look) says."""
    types = _schema_types(schema) if schema else []
    if not types:
        value = _json_value(raw)
        return raw if value is _NO_VALUE or isinstance(value, str) else value
    for kind in types:
        if kind == "string":
            continue
        value = _as_type(raw, kind)
        if value is not _NO_VALUE:
            return value
    return raw


def _schema_types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type")
    if isinstance(kind, str):
        types = [kind]
    elif isinstance(kind, list):
        types = [k for k in kind if isinstance(k, str)]
    else:
        types = []
        for key in ("anyOf", "oneOf"):
            for option in schema.get(key) or ():
                if isinstance(option, dict):
                    types.extend(t for t in _schema_types(option) if t not in types)
        if not types and "enum" in schema:
            # An enum without a type: match the raw text against its members.
            types = ["enum"]
    return types


def _as_type(raw: str, kind: str) -> Any:
    text = raw.strip()
    if kind == "integer":
        value = _json_value(text)
        if isinstance(value, bool):
            return _NO_VALUE
        if isinstance(value, int):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        return _NO_VALUE
    if kind == "number":
        value = _json_value(text)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else _NO_VALUE
    if kind == "boolean":
        lowered = text.lower()
        return True if lowered == "true" else False if lowered == "false" else _NO_VALUE
    if kind == "null":
        return None if text in ("null", "None", "") else _NO_VALUE
    if kind in ("object", "array"):
        wanted = dict if kind == "object" else list
        value = _json_value(text)
        if value is _NO_VALUE:
            try:  # a Python literal (a template that rendered a dict with `| string`)
                value = ast.literal_eval(text)
            except (ValueError, SyntaxError, MemoryError, RecursionError):
                return _NO_VALUE
        return value if isinstance(value, wanted) else _NO_VALUE
    if kind == "enum":
        value = _json_value(text)
        return value if value is not _NO_VALUE and not isinstance(value, str) else _NO_VALUE
    return _NO_VALUE


def _json_value(text: str) -> Any:
    try:
        return loads_strict(text)
    except (ValueError, RecursionError):
        return _NO_VALUE
