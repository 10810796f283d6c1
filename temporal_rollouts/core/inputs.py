"""Workflow and activity inputs checked in our own code, with errors a person can read.

Why not let the data converter validate: the Temporal Python SDK (1.35) decodes a
workflow's input while it applies the first activation, before any workflow code runs.
A pydantic ValidationError there becomes "Failed decoding arguments", a *workflow task*
failure, and the server retries that task forever (the workflow stays Running). The
workflow-level `failure_exception_types` would turn it into a Failed workflow, but with
pydantic's raw multi-line text and for every ValidationError the workflow code might
ever raise. An activity's undecodable input is a *retryable* ApplicationError that
names no field.

So the run methods and the activities are written with their typed input, and
`checked_input` shows the SDK a signature that takes plain JSON (`Any`): the converter
cannot fail on it, `temporal workflow start --input '{...}'` and the UI's form send the
same JSON as before, and recorded histories replay (same payloads, same commands). The
wrapper's first step is `parse_input`, which raises `InvalidInput` (non-retryable, stop
reason config_error) with one line per bad field in words: "group_size: must be at least
1 (got -3)".
"""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from temporal_rollouts.core.errors import InvalidInput, as_application_error

M = TypeVar("M", bound=BaseModel)

_LIMIT_WORDS = {
    "greater_than_equal": ("ge", "must be at least {}"),
    "greater_than": ("gt", "must be more than {}"),
    "less_than_equal": ("le", "must be at most {}"),
    "less_than": ("lt", "must be less than {}"),
}
_TYPE_WORDS = {
    "int_type": "a whole number",
    "int_parsing": "a whole number",
    "int_from_float": "a whole number",
    "float_type": "a number",
    "float_parsing": "a number",
    "string_type": "a string",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "dict_type": "a JSON object",
    "model_type": "a JSON object",
    "model_attributes_type": "a JSON object",
    "list_type": "a JSON list",
}
_MAX_SHOWN = 60


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _MAX_SHOWN else text[:_MAX_SHOWN] + "..."


def _field(loc: tuple) -> str:
    return ".".join(str(part) for part in loc) or "(the input)"


def describe_problem(error: dict[str, Any], model: type[BaseModel] | None = None) -> str:
    """One pydantic error (an entry of `ValidationError.errors()`) as a line of plain words."""
    kind, loc, value = error["type"], tuple(error.get("loc", ())), error.get("input")
    field = _field(loc)
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        known = ""
        if model is not None and len(loc) == 1:
            known = f" (known fields: {', '.join(model.model_fields)})"
        return f"{field}: unknown field{known}"
    if kind == "missing":
        return f"{field}: required but missing"
    if kind in _LIMIT_WORDS:
        key, words = _LIMIT_WORDS[kind]
        return f"{field}: {words.format(ctx.get(key))} (got {_shown(value)})"
    if kind in _TYPE_WORDS:
        return f"{field}: must be {_TYPE_WORDS[kind]} (got {_shown(value)})"
    if kind in ("literal_error", "enum"):
        return f"{field}: must be one of {ctx.get('expected', '?')} (got {_shown(value)})"
    message = str(error.get("msg", kind))
    return f"{field}: {message[0].lower() + message[1:] if message else kind} (got {_shown(value)})"


def describe_validation_error(err: ValidationError, model: type[BaseModel] | None = None) -> str:
    """Every problem of a ValidationError, one per line, in plain words."""
    return "\n".join(describe_problem(error, model) for error in err.errors(include_url=False))


def parse_input(model: type[M], raw: Any, what: str) -> M:
    """`raw` (decoded JSON, or already a `model`) as a `model`, else `InvalidInput` naming each bad field."""
    if isinstance(raw, model):
        return raw
    example = ""
    if raw is None or not isinstance(raw, dict):
        required = [name for name, field in model.model_fields.items() if field.is_required()]
        example = f"; it takes a JSON object with the fields {', '.join(model.model_fields)}"
        if required:
            example += f" ({', '.join(required)} required)"
        raise InvalidInput(f"invalid {what} input: expected a JSON object, got {_shown(raw)}{example}")
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        problems = describe_validation_error(err, model)
        raise InvalidInput(f"invalid {what} input:\n{problems}") from None


def field_default(model: type[BaseModel], name: str) -> Any:
    """The default of `model`'s field `name`, for a config that offers the same setting under its own name
    (the Atropos env's `max_staleness`): the model stays the one place that says it."""
    return model.model_fields[name].get_default(call_default_factory=True)


A = TypeVar("A")
R = TypeVar("R")


def checked_input(method: Callable[[A, Any], Awaitable[R]]) -> Callable[[A, Any], Awaitable[R]]:
    """For a workflow's `run` or an activity method, `(self, input: SomeModel) -> Result`: take the
    input as plain JSON and parse it first, so an undecodable input fails at once, non-retryably,
    naming the field. Put it under `@workflow.run` or `@activity.defn`, which then see `input: Any`
    and the original result type."""
    hints = typing.get_type_hints(method)
    params = [p for p in inspect.signature(method).parameters if p != "self"]
    if len(params) != 1:
        raise TypeError(f"{method.__qualname__} must take exactly one input")
    model = hints[params[0]]
    owner, _, name = method.__qualname__.rpartition(".")
    what = owner if name == "run" else f"{name} activity"  # "BatchWorkflow", "tool_call activity"

    async def parsed(self: A, input: Any = None) -> R:
        try:
            value = parse_input(model, input, what)
        except InvalidInput as err:
            raise as_application_error(err) from None
        return await method(self, value)

    functools.update_wrapper(parsed, method)
    del parsed.__wrapped__  # the SDK reads the signature: it must see `input: Any`, not the model
    parsed.__annotations__ = {"input": Any, "return": hints.get("return")}
    return parsed
