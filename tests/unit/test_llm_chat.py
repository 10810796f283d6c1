"""Unit tests of the chat client and the HTTP-status mapping, against httpx.MockTransport."""

from __future__ import annotations

import email.utils
import json
import socket
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import httpx
import pytest

from temporal_rollouts.core.errors import (
    MalformedModelReply,
    ModelError,
    ModelRequestRejected,
    ModelStalled,
    ModelUnavailable,
    ModelUnreachable,
    as_application_error,
)
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall, ToolSpec
from temporal_rollouts.llm.chat import ChatClient, ChatReply, parse_chat_completion
from temporal_rollouts.llm.http_status import error_for_exception, error_for_status, parse_retry_after

API_KEY = "sk-test-5ecret-key-0123456789"
BASE_URL = "http://model.test/v1"

Handler = Callable[[httpx.Request], httpx.Response]


def completion(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "served-model",
        "choices": [{"index": 0, "message": {"role": "assistant", **message}, "finish_reason": "stop"}],
        **extra,
    }


def client_for(handler: Handler, api_key: str | None = API_KEY) -> ChatClient:
    return ChatClient(BASE_URL, "policy-model", api_key, timeout_s=5.0, transport=httpx.MockTransport(handler))


def replying(status: int, body: Any = None, headers: dict[str, str] | None = None) -> Handler:
    def handler(request: httpx.Request) -> httpx.Response:
        if isinstance(body, (bytes, str)):
            return httpx.Response(status, content=body, headers=headers)
        return httpx.Response(status, json=body, headers=headers)

    return handler


async def complete_with(handler: Handler, api_key: str | None = API_KEY) -> ChatReply:
    async with client_for(handler, api_key) as client:
        return await client.complete([Message(role="user", content="hi")], [])


async def failure_of(handler: Handler) -> ModelError:
    with pytest.raises(ModelError) as caught:
        await complete_with(handler)
    return caught.value


TERMINAL = ToolSpec(
    name="terminal",
    description="Run a command.",
    parameters={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
)


async def test_request_carries_model_messages_tools_and_bearer_key() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"content": "ok"}))

    history = [
        Message(role="system", content="be brief"),
        Message(role="user", content="list files"),
        Message(
            role="assistant",
            tool_calls=[ToolCall(id="c1", function=FunctionCall(name="terminal", arguments='{"command":"ls"}'))],
        ),
        Message(role="tool", tool_call_id="c1", content="a.py"),
    ]
    async with client_for(handler) as client:
        await client.complete(history, [TERMINAL], temperature=0.3, max_tokens=64, extra_body={"top_p": 0.9})

    (request,) = seen
    assert request.method == "POST"
    assert str(request.url) == "http://model.test/v1/chat/completions"
    assert request.headers["authorization"] == f"Bearer {API_KEY}"
    body = json.loads(request.content)
    assert body["model"] == "policy-model"
    assert body["temperature"] == 0.3
    assert body["max_tokens"] == 64
    assert body["top_p"] == 0.9
    assert body["tools"] == [TERMINAL.to_openai()]
    assert body["messages"][2]["tool_calls"][0]["function"] == {"name": "terminal", "arguments": '{"command":"ls"}'}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "a.py"}


async def test_no_tools_and_no_key_are_left_out_of_the_request() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=completion({"content": "ok"}))

    await complete_with(handler, api_key=None)
    assert "authorization" not in seen[0].headers
    body = json.loads(seen[0].content)
    assert "tools" not in body and "max_tokens" not in body


async def test_tool_calls_keep_raw_arguments_and_reply_metadata() -> None:
    raw_arguments = '{"command": "ls  -la",\n "timeout": 5}'
    body = completion(
        {
            "content": None,
            "tool_calls": [
                {"id": "call_a", "type": "function", "function": {"name": "terminal", "arguments": raw_arguments}},
                {"id": "call_b", "type": "function", "function": {"name": "read_file", "arguments": {"path": "é.txt"}}},
            ],
        },
        usage={
            "prompt_tokens": 12,
            "completion_tokens": 7,
            "total_tokens": 19,
            "completion_tokens_details": {"reasoning_tokens": 3},
        },
    )
    body["choices"][0]["finish_reason"] = "tool_calls"

    reply = await complete_with(replying(200, body))

    calls = reply.message.tool_calls
    assert reply.message.role == "assistant" and reply.message.content is None
    assert [c.id for c in calls] == ["call_a", "call_b"]
    assert calls[0].function.arguments == raw_arguments
    assert json.loads(calls[1].function.arguments) == {"path": "é.txt"}
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == {"prompt_tokens": 12, "completion_tokens": 7, "total_tokens": 19, "reasoning_tokens": 3}
    assert reply.model == "served-model"


def test_tool_calls_without_ids_get_distinct_ids() -> None:
    call = {"type": "function", "function": {"name": "terminal", "arguments": "{}"}}
    body = json.dumps(completion({"tool_calls": [call, {**call, "id": ""}]}))
    first = parse_chat_completion(body, fallback_model="m").message.tool_calls
    second = parse_chat_completion(body, fallback_model="m").message.tool_calls
    ids = [c.id for c in first + second]
    assert all(ids) and len(set(ids)) == 4


def test_missing_model_and_usage_fall_back() -> None:
    body = completion({"content": "hi"})
    del body["model"]
    reply = parse_chat_completion(json.dumps(body), fallback_model="policy-model")
    assert reply.model == "policy-model" and reply.usage == {}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"reasoning": "R", "reasoning_content": "RC", "reasoning_details": [{"text": "D"}]}, "R"),
        ({"reasoning_content": "RC", "reasoning_details": [{"text": "D"}]}, "RC"),
        ({"reasoning": "", "reasoning_content": "RC"}, "RC"),
        (
            {"reasoning_details": [{"type": "reasoning.text", "text": "a, "}, {"type": "encrypted"}, {"text": "b"}]},
            "a, b",
        ),
        ({"reasoning": None}, None),
    ],
)
async def test_reasoning_is_taken_in_order(fields: dict[str, Any], expected: str | None) -> None:
    reply = await complete_with(replying(200, completion({"content": "answer", **fields})))
    assert reply.message.reasoning_content == expected
    assert reply.message.content == "answer"


async def test_empty_content_without_tool_calls_is_a_valid_reply() -> None:
    reply = await complete_with(replying(200, completion({"content": ""})))
    assert reply.message.content == "" and reply.message.tool_calls is None
    assert reply.finish_reason == "stop"


async def test_content_parts_are_joined() -> None:
    parts = [{"type": "text", "text": "one "}, {"type": "text", "text": "two"}]
    reply = await complete_with(replying(200, completion({"content": parts})))
    assert reply.message.content == "one two"


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529])
async def test_transient_statuses_are_retryable(status: int) -> None:
    error = await failure_of(replying(status, {"error": {"message": "server busy, try later"}}))
    assert type(error) is ModelUnavailable
    assert error.retryable is True
    assert error.status_code == status
    assert str(status) in error.message and "server busy, try later" in error.message


@pytest.mark.parametrize("status", [400, 401, 403, 404, 413, 422])
async def test_other_client_errors_are_rejected_for_good(status: int) -> None:
    error = await failure_of(replying(status, {"detail": "prompt is too long"}))
    assert type(error) is ModelRequestRejected
    assert error.retryable is False
    assert error.status_code == status
    assert "prompt is too long" in error.message


@pytest.mark.parametrize("base_url", ["http://model.test", "http://model.test/", "http://model.test:8000/api"])
async def test_a_404_from_a_base_url_without_v1_names_the_url_and_suggests_v1(base_url: str) -> None:
    async with ChatClient(
        base_url, "m", transport=httpx.MockTransport(replying(404, {"detail": "Not Found"}))
    ) as client:
        with pytest.raises(ModelRequestRejected) as caught:
            await client.complete([Message(role="user", content="hi")], [])
    root = base_url.rstrip("/")
    assert f"HTTP 404 Not Found from {root}/chat/completions" in caught.value.message
    assert f"try {root}/v1" in caught.value.message
    assert caught.value.status_code == 404


async def test_a_404_from_a_v1_url_names_the_url_without_a_hint() -> None:
    error = await failure_of(replying(404, {"detail": "no such model"}))
    assert f"from {BASE_URL}/chat/completions" in error.message and "try" not in error.message


async def test_plain_text_error_body_is_quoted_as_a_short_snippet() -> None:
    error = await failure_of(replying(502, "<html>\n  Bad   gateway " + "x" * 2000 + "</html>"))
    assert "<html> Bad gateway x" in error.message
    assert len(error.message) < 400


async def test_a_failed_request_is_sent_once() -> None:
    calls = 0

    def handler(request: httpx.Request) -> httpx.Response:
        nonlocal calls
        calls += 1
        return httpx.Response(503)

    await failure_of(handler)
    assert calls == 1


async def test_retry_after_reaches_the_error_and_temporal() -> None:
    error = await failure_of(replying(429, {"error": {"message": "slow down"}}, {"Retry-After": "3"}))
    assert error.retry_after_s == 3.0
    app_error = as_application_error(error)
    assert app_error.type == "ModelUnavailable"
    assert app_error.non_retryable is False
    assert app_error.next_retry_delay == timedelta(seconds=3)


async def test_rejection_becomes_a_non_retryable_application_error() -> None:
    app_error = as_application_error(await failure_of(replying(400, {"error": {"message": "bad"}})))
    assert app_error.type == "ModelRequestRejected" and app_error.non_retryable is True


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"Retry-After": "7"}, 7.0),
        ({"retry-after": " 1.5 "}, 1.5),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": "-4"}, None),
        ({"retry-after": "whenever"}, None),
        ({}, None),
    ],
)
def test_retry_after_seconds(headers: dict[str, str], expected: float | None) -> None:
    assert parse_retry_after(headers) == expected


def test_retry_after_http_date() -> None:
    now = 1_700_000_000.0
    in_thirty = email.utils.formatdate(now + 30, usegmt=True)
    assert parse_retry_after({"Retry-After": in_thirty}, now=now) == pytest.approx(30.0)
    past = email.utils.formatdate(now - 30, usegmt=True)
    assert parse_retry_after({"Retry-After": past}, now=now) == 0.0


def test_retry_after_date_through_status_mapping() -> None:
    now = 1_700_000_000.0
    headers = httpx.Headers({"Retry-After": email.utils.formatdate(now + 120, usegmt=True)})
    error = error_for_status(503, headers, b"", now=now)
    assert isinstance(error, ModelUnavailable) and error.retry_after_s == pytest.approx(120.0)
    assert error_for_status(200, headers, b"") is None


def test_rejections_ignore_retry_after() -> None:
    error = error_for_status(400, {"retry-after": "5"}, b"no")
    assert isinstance(error, ModelRequestRejected) and error.retry_after_s is None


@pytest.mark.parametrize(
    "body",
    [
        b"this is not json",
        b"",
        b"[1, 2]",
        json.dumps({"object": "chat.completion"}).encode(),
        json.dumps({"choices": []}).encode(),
        json.dumps({"choices": [{"finish_reason": "stop"}]}).encode(),
        json.dumps(completion({"content": 5})).encode(),
        json.dumps(completion({"tool_calls": [{"id": "c", "function": {"arguments": "{}"}}]})).encode(),
        json.dumps(completion({"tool_calls": [{"id": "c", "function": {"name": "", "arguments": "{}"}}]})).encode(),
        json.dumps(completion({"tool_calls": [{"id": "c"}]})).encode(),
        json.dumps(completion({"tool_calls": {"id": "c"}})).encode(),
        json.dumps({"error": {"message": "something odd"}}).encode(),
    ],
)
async def test_a_200_that_is_not_a_chat_completion_is_malformed(body: bytes) -> None:
    error = await failure_of(replying(200, body))
    assert type(error) is MalformedModelReply
    assert error.retryable is False
    assert error.status_code == 200
    assert error.message.startswith("model reply is not a chat completion")


async def test_a_200_carrying_a_gateway_error_code_maps_like_that_status() -> None:
    body = {"error": {"message": "upstream overloaded", "code": 503}}
    error = await failure_of(replying(200, body))
    assert type(error) is ModelUnavailable and error.status_code == 503
    assert "upstream overloaded" in error.message


@pytest.mark.parametrize(
    ("exc_type", "error_type", "wording"),
    [
        (httpx.ConnectError, ModelUnreachable, "unreachable"),
        (httpx.ReadTimeout, ModelStalled, "stalled"),
        (httpx.RemoteProtocolError, ModelUnavailable, "unreachable"),
    ],
)
async def test_transport_failures_are_retryable(exc_type: type[httpx.RequestError], error_type, wording: str) -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        raise exc_type("boom", request=request)

    error = await failure_of(handler)
    assert type(error) is error_type and error.retryable is True
    assert wording in error.message and exc_type.__name__ in error.message
    assert isinstance(error.__cause__, exc_type)


async def test_a_closed_port_is_unavailable_through_the_real_transport() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with ChatClient(f"http://127.0.0.1:{port}/v1", "m", API_KEY, timeout_s=5.0) as client:
        with pytest.raises(ModelUnreachable) as caught:
            await client.complete([Message(role="user", content="hi")], [])
    assert caught.value.status_code is None
    assert caught.value.message.startswith("model unreachable: connection refused")


@pytest.mark.parametrize(
    ("error", "attempts_retried"),
    [
        (ModelUnreachable("model unreachable: connection refused"), 3),
        (ModelStalled("model stalled"), 1),
        (ModelUnavailable("HTTP 503", status_code=503), None),
    ],
)
def test_refused_and_stalled_endpoints_give_up_after_a_few_attempts(error: ModelError, attempts_retried) -> None:
    retried = [a for a in range(1, 9) if not as_application_error(error, attempt=a).non_retryable]
    if attempts_retried is None:  # a 5xx keeps the whole retry policy's patience
        assert retried == list(range(1, 9))
    else:
        assert retried == list(range(1, attempts_retried + 1))
        last = as_application_error(error, attempt=attempts_retried + 1)
        assert last.non_retryable and f"gave up after {attempts_retried + 1} attempts" in last.message


@pytest.mark.parametrize(
    ("exc", "error_type", "retryable"),
    [
        (httpx.UnsupportedProtocol("no scheme"), ModelRequestRejected, False),
        (httpx.InvalidURL("bad url"), ModelRequestRejected, False),
        (TimeoutError(), ModelStalled, True),
        (ConnectionResetError("reset"), ModelUnavailable, True),
        (ValueError("bug"), ModelError, False),
    ],
)
def test_exception_mapping(exc: BaseException, error_type: type[ModelError], retryable: bool) -> None:
    error = error_for_exception(exc)
    assert type(error) is error_type and error.retryable is retryable
    assert type(exc).__name__ in error.message


def assert_secret_free(error: BaseException) -> None:
    for text in (str(error), repr(error), error.message, json.dumps(error.to_payload())):
        assert API_KEY not in text


async def test_api_key_never_appears_in_errors() -> None:
    echoing = {"error": {"message": f"Incorrect API key provided: {API_KEY}. Check it."}}
    rejected = await failure_of(replying(401, echoing))
    assert type(rejected) is ModelRequestRejected and "[redacted]" in rejected.message
    assert_secret_free(rejected)

    malformed = await failure_of(replying(200, f"oops {API_KEY}"))
    assert type(malformed) is MalformedModelReply
    assert_secret_free(malformed)

    def leaky_transport(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"could not connect with {request.headers['authorization']}", request=request)

    unreachable = await failure_of(leaky_transport)
    assert type(unreachable) is ModelUnreachable
    assert_secret_free(unreachable)
    assert unreachable.__cause__ is None, "a cause that names the key would reach Temporal's failure chain"
