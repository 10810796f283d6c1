"""Rendering real chat templates the way transformers' `apply_chat_template` does, for the
tokenizer and tool-call parser tests, and the tools those tests offer."""

from __future__ import annotations

import copy
import functools
import json
from datetime import datetime
from typing import Any

import pytest

from temporal_rollouts.llm.parsers import ParsedTurn
from tests.support import TEMPLATES

# Kimi-K2-Instruct and -Thinking append to a list inside the template, which jinja's
# immutable sandbox (the one transformers uses) refuses; they render in the mutable one.
MUTATING_TEMPLATES = {"kimi_k2_instruct.jinja", "kimi_k2_thinking.jinja"}


def compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def calls_of(turn: ParsedTurn) -> list[tuple[str, str]]:
    return [(call.function.name, call.function.arguments) for call in turn.tool_calls]


@functools.cache
def environment(mutable: bool = False):
    jinja2 = pytest.importorskip("jinja2", reason="rendering the real chat templates needs jinja2")
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment, SandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(
        value: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        # transformers replaces jinja's tojson (which HTML-escapes and sorts keys) with plain json.dumps
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    cls = SandboxedEnvironment if mutable else ImmutableSandboxedEnvironment
    env = cls(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


@functools.cache
def template(name: str):
    return environment(name in MUTATING_TEMPLATES).from_string((TEMPLATES / name).read_text())


def render(
    name: str,
    messages: list[dict],
    *,
    tools: list[dict] | None = None,
    add_generation_prompt: bool = False,
    **extra: Any,
) -> str:
    return template(name).render(
        messages=copy.deepcopy(messages), tools=tools, add_generation_prompt=add_generation_prompt, **extra
    )


TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "kelvin"]}},
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web",
            "parameters": {
                "type": "object",
                "properties": {"query": {"type": "string"}, "filters": {"type": "object"}},
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "write_file",
            "description": "Write a file",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "content": {"type": "string"},
                    "overwrite": {"type": "boolean"},
                    "retries": {"type": "integer"},
                    "version": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}},
                },
            },
        },
    },
]
