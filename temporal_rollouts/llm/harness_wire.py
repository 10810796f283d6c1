"""A harness's chat-completions request, read as a model turn; the turn's reply written as its answer.

A harness in the slot speaks OpenAI's chat completions. Each request it sends becomes one
model-turn step (workflows/harness_loop.py), so it is read here into what a turn takes: the
conversation (our `Message`s), the tools offered, and the harness's own cap on the reply's
length. What it cannot change is how the policy samples: temperature, top_p and the like are
the rollout's (a trainer decides them, not the harness), and are ignored. `extends` decides
whether a request continues the conversation so far (one token sequence) or rewrites it (a
harness that trims or summarises: a new sequence, counted).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, Field

from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall, ToolSpec
from temporal_rollouts.llm.chat import raw_arguments

ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
"""Roles a harness may send, as our transcript holds them (a `developer` message is a system prompt)."""
EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


class BadHarnessRequest(ValueError):
    """A request the endpoint answers with HTTP 400 (the harness's mistake): it costs no model turn."""


class HarnessRequest(BaseModel):
    messages: list[Message]
    tools: list[ToolSpec] = Field(default_factory=list)
    max_tokens: int | None = Field(default=None, description="The harness's own cap on the reply's length.")


def parse_request(body: Any) -> HarnessRequest:
    """The chat-completions request `body` (parsed JSON), or BadHarnessRequest saying what is wrong."""
    if not isinstance(body, dict):
        raise BadHarnessRequest("the request body must be a JSON object")
    raw_messages = body.get("messages")
    if not isinstance(raw_messages, list) or not raw_messages:
        raise BadHarnessRequest("`messages` must be a non-empty list")
    if body.get("n", 1) not in (1, None):
        raise BadHarnessRequest("`n` must be 1: each request is one model turn")
    if body.get("functions"):
        raise BadHarnessRequest("`functions` is not supported: offer them as `tools`")
    messages = [_message(index, raw) for index, raw in enumerate(raw_messages)]
    tools = [_tool(index, raw) for index, raw in enumerate(body.get("tools") or [])]
    cap = body.get("max_completion_tokens", body.get("max_tokens"))
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        raise BadHarnessRequest("`max_tokens` must be a positive integer")
    return HarnessRequest(messages=messages, tools=tools, max_tokens=cap)


def _message(index: int, raw: Any) -> Message:
    where = f"messages[{index}]"
    if not isinstance(raw, dict):
        raise BadHarnessRequest(f"{where} must be an object")
    role = ROLES.get(raw.get("role"))  # type: ignore[arg-type]
    if role is None:
        raise BadHarnessRequest(f"{where}.role must be one of {', '.join(ROLES)}, not {raw.get('role')!r}")
    calls = raw.get("tool_calls") or []
    if not isinstance(calls, list) or (calls and role != "assistant"):
        raise BadHarnessRequest(f"{where}.tool_calls must be a list, on an assistant message")
    reasoning = raw.get("reasoning_content", raw.get("reasoning"))
    return Message(
        role=role,  # type: ignore[arg-type]
        content=_text(raw.get("content"), where),
        tool_calls=[_tool_call(f"{where}.tool_calls[{i}]", call) for i, call in enumerate(calls)] or None,
        tool_call_id=_optional_text(raw.get("tool_call_id"), f"{where}.tool_call_id"),
        name=_optional_text(raw.get("name"), f"{where}.name"),
        reasoning_content=reasoning if isinstance(reasoning, str) and reasoning else None,
    )


def _text(content: Any, where: str) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if (
                not isinstance(part, dict)
                or part.get("type", "text") != "text"
                or not isinstance(part.get("text"), str)
            ):
                raise BadHarnessRequest(f"{where}.content: only text parts are supported")
            parts.append(part["text"])
        return "".join(parts)
    raise BadHarnessRequest(f"{where}.content must be text or a list of text parts")


def _optional_text(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    raise BadHarnessRequest(f"{where} must be a string")


def _tool_call(where: str, raw: Any) -> ToolCall:
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise BadHarnessRequest(f"{where} must be a function call with a name")
    arguments = raw_arguments(function.get("arguments"))
    call_id = raw.get("id")
    if not isinstance(call_id, str) or not call_id:
        raise BadHarnessRequest(f"{where}.id must be a non-empty string")
    return ToolCall(id=call_id, function=FunctionCall(name=function["name"], arguments=arguments))


def _tool(index: int, raw: Any) -> ToolSpec:
    where = f"tools[{index}]"
    function = raw.get("function") if isinstance(raw, dict) and raw.get("type", "function") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str) or not function["name"]:
        raise BadHarnessRequest(f"{where} must be a function tool with a name")
    parameters = function.get("parameters")
    if parameters is not None and not isinstance(parameters, dict):
        raise BadHarnessRequest(f"{where}.function.parameters must be a JSON schema object")
    description = function.get("description")
    return ToolSpec(
        name=function["name"],
        description=description if isinstance(description, str) else "",
        parameters=parameters or EMPTY_PARAMETERS,
    )


def extends(sequence: Sequence[Message], messages: Sequence[Message]) -> bool:
    """Whether `messages` continue `sequence` (the last request's messages and the reply to it): they
    begin with it, message for message, and add to it. Compared as a harness may echo them back:
    content None and "" alike, tool-call arguments as JSON values, the reasoning left out (most
    harnesses drop it; the sequence keeps the model's own)."""
    if len(messages) <= len(sequence):
        return False
    return all(_same(ours, theirs) for ours, theirs in zip(sequence, messages))


def _same(ours: Message, theirs: Message) -> bool:
    return _key(ours) == _key(theirs)


def _key(message: Message) -> tuple:
    calls = tuple(
        (call.id, call.function.name, _json_value(call.function.arguments)) for call in message.tool_calls or []
    )
    return (
        message.role,
        message.content or "",
        message.tool_call_id,
        message.name if message.role != "assistant" else None,
        calls,
    )


def _json_value(arguments: str) -> str:
    try:
        return json.dumps(json.loads(arguments), sort_keys=True)
    except ValueError:
        return arguments


def completion(
    reply: Message,
    *,
    request_id: str,
    model: str,
    finish_reason: str | None,
    prompt_tokens: int | None,
    completion_tokens: int | None,
) -> dict[str, Any]:
    """The `chat.completion` a harness reads: the reply as the transcript keeps it, its reasoning in
    `reasoning_content` (where vLLM and SGLang put it)."""
    message: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        message["tool_calls"] = [call.model_dump() for call in reply.tool_calls]
    if reply.reasoning_content:
        message["reasoning_content"] = reply.reasoning_content
    finish = "tool_calls" if reply.tool_calls else (finish_reason if finish_reason in ("stop", "length") else "stop")
    prompt, generated = prompt_tokens or 0, completion_tokens or 0
    return {
        "id": f"chatcmpl-{request_id}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": prompt, "completion_tokens": generated, "total_tokens": prompt + generated},
    }


def error_body(message: str, status: int, kind: str = "invalid_request_error") -> dict[str, Any]:
    """OpenAI's error shape, which harnesses' clients read."""
    return {"error": {"message": message, "type": kind, "code": status}}
