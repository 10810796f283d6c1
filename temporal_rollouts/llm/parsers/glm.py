"""GLM-4.5 / 4.6 / 4.7 tool calls: a name, then key/value tag pairs, in `<tool_call>`.

GLM-4.5 and GLM-4.6 (`glm45`, aliases `glm4_moe`, `glm46`) put each piece on its own line:

    <tool_call>write_file
    <arg_key>path</arg_key>
    <arg_value>notes.txt</arg_value>
    <arg_key>overwrite</arg_key>
    <arg_value>true</arg_value>
    </tool_call>

GLM-4.7 (`glm47`) writes the same thing with no newlines at all:

    <tool_call>write_file<arg_key>path</arg_key><arg_value>notes.txt</arg_value></tool_call>

Values are bare text: the templates write a string as it is and anything else
with `tojson`, so a value is typed the way qwen3_coder types its parameters
(by the tool's JSON schema when the parser has `tools=`, else by its look; see
`llm.parsers.qwen3_coder.typed_value`). The text between the tags is the value,
whitespace and all.

Content is the text before the first `<tool_call>`; reasoning is
`<think>...</think>` (GLM-4.7's generation prompt already holds `<think>`, so
its output starts inside the reasoning). Generation stops on `<|observation|>`
(a tool call) or `<|user|>`, which are ignored when they trail.

A value is taken up to its `</arg_value>`, so a value may itself contain
`</tool_call>`, `<tool_call>` or `<arg_key>` (a file about GLM's format, say).
Tolerated: a missing `</tool_call>` (the text ends, or the next `<tool_call>`
starts), a value never closed (it runs to the next `<arg_key>`, else the end),
a missing `</arg_key>`, and a Hermes JSON object inside `<tool_call>` instead
of tags. A key with no value at all (generation cut off
right after it) is dropped. A block with arguments but no name becomes a call
named "" with the block's text as its arguments.
"""

from __future__ import annotations

from typing import Any, ClassVar

from temporal_rollouts.llm.parsers.base import (
    RawCall,
    ToolCallParser,
    calls_from_json_text,
    compact_json,
    register_parser,
)
from temporal_rollouts.llm.parsers.qwen3_coder import typed_value


def tagged_blocks(
    text: str, open_tag: str, close_tag: str, quote: tuple[str, str] | None = None
) -> tuple[str, list[str]] | None:
    """(text before the first block, each block's body), or None when `open_tag` never occurs.

    A block ends at its close tag, at the next open tag, or at the end of the text;
    text between blocks and after the last one is dropped. Inside a block, a span
    between `quote`'s two tags (an argument value) is opaque: a close or open tag
    written inside a value does not end the block. A quote never closed runs to the end."""
    start = text.find(open_tag)
    if start == -1:
        return None
    bodies: list[str] = []
    pos = start
    while pos != -1:
        body_start = scan = pos + len(open_tag)
        close = following = body_start - 1
        while True:
            # (re)search only what the last value skipped past; -1 stays -1
            if close != -1 and close < scan:
                close = text.find(close_tag, scan)
            if following != -1 and following < scan:
                following = text.find(open_tag, scan)
            quoted = text.find(quote[0], scan) if quote else -1
            found = [at for at in (close, following, quoted) if at != -1]
            first = min(found) if found else -1
            if quote is not None and first != -1 and first == quoted:
                quote_end = text.find(quote[1], quoted + len(quote[0]))
                if quote_end != -1:
                    scan = quote_end + len(quote[1])
                    continue
                first = -1  # a value cut off: the block runs to the end
            break
        if first == -1:
            end = after = len(text)
        elif first == close:
            end, after = close, close + len(close_tag)
        else:
            end = after = following
        bodies.append(text[body_start:end])
        pos = text.find(open_tag, after) if after < len(text) else -1
    return text[:start], bodies


def strip_trailing(text: str, markers: tuple[str, ...]) -> str:
    """`text` without any of `markers` (and whitespace) at its end, however many."""
    body = text
    while True:
        trimmed = body.rstrip()
        for marker in markers:
            if marker and trimmed.endswith(marker):
                body = trimmed[: -len(marker)]
                break
        else:
            return body


@register_parser("glm45", "glm4_moe", "glm46")
class Glm45Parser(ToolCallParser):
    """GLM-4.5/4.6; subclasses change the tags (GLM-4.7, LongCat-Flash-Lite)."""

    call_open: ClassVar[str] = "<tool_call>"
    call_close: ClassVar[str] = "</tool_call>"
    key_open: ClassVar[str] = "<arg_key>"
    key_close: ClassVar[str] = "</arg_key>"
    value_open: ClassVar[str] = "<arg_value>"
    value_close: ClassVar[str] = "</arg_value>"
    # Stop tokens that may trail the generated text besides base.END_OF_TURN_MARKERS.
    stop_markers: ClassVar[tuple[str, ...]] = ("<|observation|>", "<|user|>")
    call_markers = ("<tool_call>",)

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        return super().split_reasoning(strip_trailing(text, self.stop_markers))

    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        found = tagged_blocks(text, self.call_open, self.call_close, (self.value_open, self.value_close))
        if found is None:
            return text, []
        content, bodies = found
        calls: list[RawCall] = []
        for body in bodies:
            if not body.strip():
                continue
            if body.lstrip()[:1] in ("{", "[", "`"):  # a Hermes-style JSON call in the block
                calls.extend(calls_from_json_text(body))
            else:
                calls.append(self._tagged_call(body))
        return content, calls

    def _tagged_call(self, body: str) -> RawCall:
        first_key = body.find(self.key_open)
        head = body if first_key == -1 else body[:first_key]
        name = head.strip()
        if "\n" in name:  # prose after the name on later lines is not part of it
            name = name.split("\n", 1)[0].strip()
        if first_key == -1:
            return RawCall(name, "{}") if name else RawCall("", body.strip())
        if not name:
            return RawCall("", body.strip())
        return RawCall(name, compact_json(self._arguments(name, body[first_key:])))

    def _arguments(self, function: str, text: str) -> dict[str, Any]:
        """Key/value pairs in order. A value ends at its close tag; one never closed ends
        at the next key tag (or the end of the block), so a value may hold key tags."""
        properties = self.tool_schemas.get(function, {}).get("properties")
        properties = properties if isinstance(properties, dict) else {}
        values: dict[str, Any] = {}
        pos = text.find(self.key_open)
        while pos != -1:
            key_start = pos + len(self.key_open)
            value_at = text.find(self.value_open, key_start)
            next_key = text.find(self.key_open, key_start)
            if value_at == -1 or (next_key != -1 and next_key < value_at):
                pos = next_key  # a key without a value: cut off, or the model skipped it
                continue
            key_end = text.find(self.key_close, key_start, value_at)
            key = text[key_start : key_end if key_end != -1 else value_at].strip()
            value_start = value_at + len(self.value_open)
            close = text.find(self.value_close, value_start)
            if close != -1:
                raw, pos = text[value_start:close], text.find(self.key_open, close)
            else:
                following = text.find(self.key_open, value_start)
                raw = text[value_start : following if following != -1 else len(text)]
                pos = following
            if key:
                schema = properties.get(key)
                values[key] = typed_value(raw, schema if isinstance(schema, dict) else None)
        return values


@register_parser("glm47")
class Glm47Parser(Glm45Parser):
    """GLM-4.7: the same tags without newlines; parsed by the same code."""
