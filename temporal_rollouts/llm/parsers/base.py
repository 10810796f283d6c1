"""What every tool-call parser shares: the result type, the registry and the JSON helpers.

A token-level RL client gets raw generated text back, not OpenAI `tool_calls`.
A parser turns that text into a `ParsedTurn`: the visible content, the tool
calls in OpenAI's wire shape, and the reasoning the model wrote before them.

Rules every parser follows, whatever its family:

* Parsing never raises on model output. Whatever the model wrote is either
  content, reasoning, or part of a tool call.
* Tool-call ids are `call_<8 hex>`, a hash of (seed, text, index): parsing the
  same text again gives the same ids, so a replayed turn matches its record.
* `arguments` is JSON text. An object is re-dumped compactly; a string that is
  itself the JSON text of an object (double-encoded, as templates that
  `tojson` an already-serialised OpenAI argument string produce) is decoded
  once; anything that is not valid JSON is kept as the model's raw string so
  the tool layer can answer with a helpful error. A call whose name cannot be
  recovered at all gets the name "" and its raw text as arguments.
* Trailing end-of-turn tokens (`<|im_end|>`, `<|eot_id|>`, `</s>`, ...) are
  ignored, so text decoded with or without special tokens parses the same.
  Families whose call markers are special tokens (Mistral's `[TOOL_CALLS]`,
  DeepSeek's `<｜tool▁calls▁begin｜>`, Llama's `<|python_tag|>`) need the
  text decoded with special tokens kept.
"""

from __future__ import annotations

import hashlib
import json
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, TypeVar

from pydantic import BaseModel, Field

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall, ToolSpec

# Tokens that end a turn; generation stops on them, so they only ever trail.
END_OF_TURN_MARKERS = (
    "<|im_end|>",
    "<|endoftext|>",
    "<|eot_id|>",
    "<|eom_id|>",
    "<|end_of_text|>",
    "</s>",
    "<｜end▁of▁sentence｜>",
)


class ParsedTurn(BaseModel):
    """One assistant turn rebuilt from generated text."""

    content: str | None = None
    tool_calls: list[ToolCall] = Field(default_factory=list)
    reasoning: str | None = None

    def to_message(self) -> Message:
        return Message(
            role="assistant",
            content=self.content,
            tool_calls=self.tool_calls or None,
            reasoning_content=self.reasoning,
        )


class RawCall(NamedTuple):
    """A call as a family parser found it, before it gets its id."""

    name: str
    arguments: str


ToolsArg = Sequence[ToolSpec | Mapping[str, Any]] | None


class ToolCallParser(ABC):
    """Base of every family's parser; subclasses implement `extract`.

    `tools` (ToolSpecs or OpenAI tool dicts) is optional; parsers whose format
    carries untyped text (qwen3_coder) use the parameter schemas to type values.
    """

    name: ClassVar[str] = ""
    # (open, close) pairs of reasoning delimiters, tried in order.
    reasoning_tags: ClassVar[tuple[tuple[str, str], ...]] = (("<think>", "</think>"),)
    # Strings that start a tool call: a reasoning close tag after one of these is not reasoning.
    call_markers: ClassVar[tuple[str, ...]] = ()

    def __init__(self, tools: ToolsArg = None) -> None:
        self.tool_schemas: dict[str, dict[str, Any]] = tool_parameter_schemas(tools)

    def parse(self, text: str, *, id_seed: str = "") -> ParsedTurn:
        """Split generated text into content, tool calls and reasoning.

        `id_seed` (a rollout id and turn index, say) makes ids differ between
        turns that happen to generate the same text.
        """
        body = strip_end_of_turn(text)
        reasoning, body = self.split_reasoning(body)
        content, raw_calls = self.extract(body)
        calls = [
            ToolCall(
                id=make_call_id(text, index, id_seed), function=FunctionCall(name=call.name, arguments=call.arguments)
            )
            for index, call in enumerate(raw_calls)
        ]
        return ParsedTurn(content=clean_text(content), tool_calls=calls, reasoning=reasoning)

    @abstractmethod
    def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
        """Content and calls from text with reasoning and end-of-turn tokens already removed."""

    def split_reasoning(self, text: str) -> tuple[str | None, str]:
        """(reasoning, rest). A leading open tag starts reasoning; a close tag with no open
        tag before it (the prompt ended with the open tag) closes reasoning that began the text.
        An open tag never closed makes the whole rest reasoning (generation was cut off)."""
        for open_tag, close_tag in self.reasoning_tags:
            stripped = text.lstrip()
            if stripped.startswith(open_tag):
                inner = stripped[len(open_tag) :]
                end = inner.find(close_tag)
                if end == -1:
                    return clean_text(inner), ""
                return clean_text(inner[:end]), inner[end + len(close_tag) :]
            end = text.find(close_tag)
            if end != -1:
                before = text[:end]
                if open_tag not in before and not any(marker in before for marker in self.call_markers):
                    return clean_text(before), text[end + len(close_tag) :]
        return None, text


# ---------------------------------------------------------------------------- registry

_REGISTRY: dict[str, type[ToolCallParser]] = {}

P = TypeVar("P", bound=type[ToolCallParser])


def register_parser(name: str, *aliases: str) -> Callable[[P], P]:
    """Class decorator: make a parser class available to `get_parser` under `name` (and aliases)."""

    def decorate(cls: P) -> P:
        for key in (name, *aliases):
            existing = _REGISTRY.get(key)
            if existing is not None and existing is not cls:
                raise ConfigError(f"tool-call parser {key!r} is already registered by {existing.__name__}")
            _REGISTRY[key] = cls
        if "name" not in cls.__dict__:
            cls.name = name
        return cls

    return decorate


def get_parser(name: str, *, tools: ToolsArg = None) -> ToolCallParser:
    """A new parser for a family name; an unknown name is a ConfigError naming the known ones."""
    cls = _REGISTRY.get(name) or _REGISTRY.get(name.strip().lower().replace("-", "_"))
    if cls is None:
        raise ConfigError(f"unknown tool-call parser {name!r}; known parsers: {', '.join(parser_names())}")
    return cls(tools)


def parser_names() -> list[str]:
    return sorted(_REGISTRY)


# ---------------------------------------------------------------------------- helpers


def make_call_id(text: str, index: int, seed: str = "") -> str:
    digest = hashlib.sha256(f"{seed}\x00{index}\x00{text}".encode()).hexdigest()
    return f"call_{digest[:8]}"


def strip_end_of_turn(text: str) -> str:
    body = text
    while True:
        trimmed = body.rstrip()
        for marker in END_OF_TURN_MARKERS:
            if trimmed.endswith(marker):
                body = trimmed[: -len(marker)]
                break
        else:
            return body


def clean_text(text: str | None) -> str | None:
    if text is None:
        return None
    text = text.strip()
    return text or None


def compact_json(value: Any) -> str:
    """JSON text of `value`; ValueError for a value JSON cannot hold (infinity, NaN), never `Infinity`."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def loads_strict(text: str) -> Any:
    """json.loads that refuses NaN and Infinity, which cannot be dumped back as JSON."""
    return json.loads(text, parse_constant=_reject_constant)


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def decode_prefix(text: str, pos: int = 0) -> tuple[Any, int]:
    """Decode one JSON value at `pos` (after whitespace); (value, end). Raises ValueError."""
    while pos < len(text) and text[pos].isspace():
        pos += 1
    return _DECODER.raw_decode(text, pos)


def arguments_from_value(value: Any) -> str:
    """Arguments JSON text from an already-decoded value (the "arguments" of a decoded call)."""
    if value is None:
        return "{}"
    if isinstance(value, str):
        if not value.strip():
            return "{}"
        try:
            decoded = loads_strict(value)
        except ValueError:
            return value
        return compact_json(decoded) if isinstance(decoded, dict) else value
    return compact_json(value)


def arguments_from_text(raw: str) -> str:
    """Arguments JSON text from the model's raw argument text."""
    text = strip_code_fence(raw.strip())
    if not text:
        return "{}"
    try:
        decoded = loads_strict(text)
    except ValueError:
        return text
    if isinstance(decoded, str):
        try:
            inner = loads_strict(decoded)
        except ValueError:
            return compact_json(decoded)
        return compact_json(inner) if isinstance(inner, dict) else compact_json(decoded)
    return compact_json(decoded)


_FENCE = re.compile(r"^```[A-Za-z0-9_-]*[ \t]*\n?(.*?)\n?```$", re.DOTALL)


def strip_code_fence(text: str) -> str:
    """`text` without one surrounding markdown code fence (```json ... ```), if it has one."""
    stripped = text.strip()
    match = _FENCE.match(stripped)
    if match:
        return match.group(1).strip()
    if stripped.startswith("```"):  # an opening fence the model never closed
        newline = stripped.find("\n")
        return stripped[newline + 1 :].strip() if newline != -1 else ""
    return stripped


def call_from_object(obj: Any, *, args_keys: Iterable[str] = ("arguments", "parameters")) -> RawCall:
    """A call from a decoded JSON value shaped like {"name": ..., "arguments": ...}.

    Also takes OpenAI's own shape ({"type": "function", "function": {...}}). A value
    with no usable name keeps all of its text as arguments under the name ""."""
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict) and "name" not in obj:
        obj = obj["function"]
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return RawCall("", compact_json(obj))
    for key in args_keys:
        if key in obj:
            return RawCall(obj["name"].strip(), arguments_from_value(obj[key]))
    return RawCall(obj["name"].strip(), "{}")


def calls_from_json_text(text: str, *, args_keys: Iterable[str] = ("arguments", "parameters")) -> list[RawCall]:
    """Every call in text holding one or more JSON call objects (or lists of them),
    separated by whitespace, commas or semicolons. Text that does not decode is salvaged."""
    body = strip_code_fence(text)
    keys = tuple(args_keys)
    calls: list[RawCall] = []
    pos = 0
    while True:
        while pos < len(body) and (body[pos].isspace() or body[pos] in ",;]"):
            pos += 1
        if pos >= len(body):
            return calls
        try:
            value, pos = decode_prefix(body, pos)
        except ValueError:
            if body[pos] == "[":  # a list that does not decode whole: take its items one by one
                pos += 1
                continue
            if not calls or body[pos] == "{":  # prose after a decoded call is not another call
                calls.append(salvage_call(body[pos:], args_keys=keys))
            return calls
        items = value if isinstance(value, list) else [value]
        calls.extend(call_from_object(item, args_keys=keys) for item in items)


_NAME_FIELD = re.compile(r'"name"\s*:\s*"((?:[^"\\]|\\.)*)"')


def salvage_call(text: str, *, args_keys: Iterable[str] = ("arguments", "parameters")) -> RawCall:
    """Best effort for a call object that is not valid JSON: the name by pattern,
    the arguments as the text after their key (valid JSON if the damage was outside them)."""
    body = text.strip()
    name_match = _NAME_FIELD.search(body)
    if name_match is None:
        return RawCall("", body)
    try:
        name = json.loads(f'"{name_match.group(1)}"')
    except ValueError:
        name = name_match.group(1)
    args_match = None
    for key in args_keys:
        args_match = re.search(rf'"{re.escape(key)}"\s*:', body)
        if args_match:
            break
    if args_match is None:
        return RawCall(name.strip(), "{}")
    raw = body[args_match.end() :].strip()
    try:
        value, _ = decode_prefix(raw)
    except ValueError:
        return RawCall(name.strip(), _drop_outer_closers(raw))
    return RawCall(name.strip(), arguments_from_value(value))


def _drop_outer_closers(raw: str) -> str:
    """Remove trailing `}`s that close the enclosing call object rather than the arguments."""
    excess = _bracket_balance(raw)
    text = raw.rstrip()
    while excess < 0 and text.endswith("}"):
        text = text[:-1].rstrip()
        excess += 1
    return text


def _bracket_balance(text: str) -> int:
    """Opened minus closed braces outside JSON strings."""
    depth = 0
    in_string = False
    escaped = False
    for char in text:
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
    return depth


def tool_parameter_schemas(tools: ToolsArg) -> dict[str, dict[str, Any]]:
    """{tool name: its parameters JSON schema} from ToolSpecs or OpenAI tool dicts."""
    schemas: dict[str, dict[str, Any]] = {}
    for tool in tools or ():
        if isinstance(tool, ToolSpec):
            schemas[tool.name] = tool.parameters
            continue
        spec = tool.get("function", tool) if isinstance(tool, Mapping) else None
        if isinstance(spec, Mapping) and isinstance(spec.get("name"), str):
            params = spec.get("parameters")
            schemas[spec["name"]] = dict(params) if isinstance(params, Mapping) else {}
    return schemas
