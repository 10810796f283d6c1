"""A small client for OpenAI-compatible chat completions with tools.

One model turn is one Temporal activity, so a call here is exactly one HTTP
request and never retried: failures become typed errors (see
`temporal_rollouts.llm.http_status`) and Temporal decides when to try again. The reply keeps
what RL training needs verbatim: the raw tool-call arguments and the
reasoning text.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

import httpx
from pydantic import BaseModel, Field

from temporal_rollouts.core.errors import MalformedModelReply, ModelRequestRejected
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall, ToolSpec
from temporal_rollouts.llm.http_status import error_for_status, error_snippet
from temporal_rollouts.llm.transport import model_http_client, post_json

DETAIL_USAGE_KEYS = {
    "prompt_tokens_details": ("cached_tokens",),
    "completion_tokens_details": ("reasoning_tokens",),
}


class ChatReply(BaseModel):
    message: Message
    finish_reason: str | None = None
    usage: dict[str, int] = Field(
        default_factory=dict,
        description="Token counts the server reported: prompt_tokens, completion_tokens, ... when present.",
    )
    model: str
    weight_version: str | None = None
    """The version of the weights that answered, where the server says (SGLang: `metadata.weight_version`)."""


class ChatClient:
    """Chat completions against one endpoint, over one pooled HTTP client."""

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int | None = 256,
    ) -> None:
        self.model = model
        self._secrets = (api_key,) if api_key else ()
        self._http = model_http_client(
            base_url, api_key, timeout_s, transport=transport, max_connections=max_connections
        )

    async def __aenter__(self) -> ChatClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def complete(
        self,
        messages: list[Message],
        tools: list[ToolSpec],
        *,
        temperature: float = 1.0,
        max_tokens: int | None = None,
        extra_body: dict[str, Any] | None = None,
    ) -> ChatReply:
        """One chat completion; raises `ModelError` subclasses on any failure."""
        body: dict[str, Any] = {
            "model": self.model,
            "messages": [message.to_openai() for message in messages],
            "temperature": temperature,
        }
        if tools:
            body["tools"] = [tool.to_openai() for tool in tools]
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        body.update(extra_body or {})
        try:
            response = await post_json(self._http, "chat/completions", body, secrets=self._secrets)
        except ModelRequestRejected as err:
            if err.status_code != 404:
                raise
            raise ModelRequestRejected(not_found_message(err.message, self._http.base_url), status_code=404) from None
        return parse_chat_completion(response.content, fallback_model=self.model, secrets=self._secrets)


def not_found_message(message: str, base_url: httpx.URL) -> str:
    """A 404 names the URL it came from and, when the base URL lacks it, suggests `/v1`: the usual
    cause is a server root given where an OpenAI-compatible base URL was meant."""
    root = str(base_url.copy_with(username=None, password=None, query=None)).rstrip("/")
    answer = message.removeprefix("model server answered HTTP 404 Not Found")
    hint = "" if root.endswith("/v1") else f" (an OpenAI-compatible base URL usually ends in /v1: try {root}/v1)"
    return f"model server answered HTTP 404 Not Found from {root}/chat/completions{answer}{hint}"


def parse_chat_completion(body: bytes | str, *, fallback_model: str, secrets: Iterable[str] = ()) -> ChatReply:
    """Read the first choice of a 200 chat-completion body, or raise `MalformedModelReply`.

    A 200 that carries only an `{"error": {"code": <HTTP status>}}` object (some
    gateways do this) is mapped as if that status had been returned.
    """
    secrets = tuple(secrets)

    def malformed(reason: str) -> MalformedModelReply:
        snippet = error_snippet(body, secrets=secrets)
        return MalformedModelReply(f"model reply is not a chat completion: {reason}; body: {snippet}", status_code=200)

    try:
        data = json.loads(body)
    except ValueError:
        raise malformed("not JSON") from None
    if not isinstance(data, dict):
        raise malformed("not a JSON object")
    choices = data.get("choices")
    if not choices and isinstance(error := data.get("error"), dict):
        code = error.get("code")
        if isinstance(code, int) and 400 <= code < 600:
            status_error = error_for_status(code, {}, body, secrets=secrets)
            if status_error is not None:
                raise status_error
        raise malformed("error object instead of choices")
    if not isinstance(choices, list) or not choices:
        raise malformed("no choices")
    choice = choices[0]
    if not isinstance(choice, dict) or not isinstance(choice.get("message"), dict):
        raise malformed("choice without a message")
    raw = choice["message"]

    content = _content_text(raw.get("content"), malformed)
    raw_calls = raw.get("tool_calls") or []
    if not isinstance(raw_calls, list):
        raise malformed("tool_calls is not a list")
    tool_calls = [_tool_call(item, malformed) for item in raw_calls]
    finish_reason = choice.get("finish_reason")
    model = data.get("model")
    return ChatReply(
        message=Message(
            role="assistant",
            content=content,
            tool_calls=tool_calls or None,
            reasoning_content=_reasoning_text(raw),
        ),
        finish_reason=finish_reason if isinstance(finish_reason, str) else None,
        usage=_usage(data.get("usage")),
        model=model if isinstance(model, str) and model else fallback_model,
        weight_version=_weight_version(data),
    )


def _weight_version(data: dict) -> str | None:
    metadata = data.get("metadata")
    version = metadata.get("weight_version") if isinstance(metadata, dict) else None
    return str(version) if isinstance(version, (str, int)) and not isinstance(version, bool) else None


Malformed = Callable[[str], MalformedModelReply]


def _content_text(content: Any, malformed: Malformed) -> str | None:
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) for part in content):
        return "".join(part["text"] for part in content if isinstance(part.get("text"), str))
    raise malformed("message content is neither text nor a list of text parts")


def _tool_call(item: Any, malformed: Malformed) -> ToolCall:
    function = item.get("function") if isinstance(item, dict) else None
    if not isinstance(function, dict):
        raise malformed("tool call without a function")
    name = function.get("name")
    if not isinstance(name, str) or not name:
        raise malformed("tool call without a function name")
    arguments = raw_arguments(function.get("arguments"))
    call_id = item.get("id")
    if not isinstance(call_id, str) or not call_id:
        call_id = f"call_{uuid.uuid4().hex[:24]}"
    return ToolCall(id=call_id, function=FunctionCall(name=name, arguments=arguments))


def raw_arguments(arguments: Any) -> str:
    """A tool call's arguments as JSON text: as sent when they are text, encoded when a server sent an object."""
    if arguments is None:
        return "{}"
    return arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)


def _reasoning_text(message: dict[str, Any]) -> str | None:
    for key in ("reasoning", "reasoning_content"):
        if isinstance(text := message.get(key), str) and text:
            return text
    details = message.get("reasoning_details")
    if isinstance(details, list):
        text = "".join(d["text"] for d in details if isinstance(d, dict) and isinstance(d.get("text"), str))
        if text:
            return text
    return None


def _usage(raw: Any) -> dict[str, int]:
    if not isinstance(raw, dict):
        return {}
    usage = {key: value for key, value in raw.items() if _is_count(value)}
    for section, keys in DETAIL_USAGE_KEYS.items():
        details = raw.get(section)
        if isinstance(details, dict):
            usage.update({key: details[key] for key in keys if _is_count(details.get(key))})
    return usage


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
