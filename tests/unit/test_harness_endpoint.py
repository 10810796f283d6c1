"""A harness's model endpoint on its unix socket, read by OpenAI's own client: a streamed answer, and a
request whose client gave up and sent it again."""

from __future__ import annotations

import asyncio
import json
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
from openai import AsyncOpenAI

from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall
from temporal_rollouts.llm.harness_wire import completion
from temporal_rollouts.sandbox_server.harness.endpoint import ModelEndpoint

KEY = "harness-key"
REPLY = Message(
    role="assistant",
    content="Listing.",
    tool_calls=[ToolCall(id="call_1", function=FunctionCall(name="bash", arguments='{"command": "ls"}'))],
)


@pytest.fixture
async def endpoint() -> AsyncIterator[ModelEndpoint]:
    with tempfile.TemporaryDirectory(prefix="ep-") as folder:  # a short path: a unix socket's is at most 107 bytes
        served = ModelEndpoint(Path(folder) / "model.sock", KEY, "policy")
        await served.start()
        try:
            yield served
        finally:
            await served.close()


def transport(endpoint: ModelEndpoint) -> httpx.AsyncHTTPTransport:
    return httpx.AsyncHTTPTransport(uds=str(endpoint.socket_path))


async def answer_next(endpoint: ModelEndpoint) -> str:
    pending = await endpoint.next(10, asyncio.Event())
    assert pending is not None
    body = completion(
        REPLY, request_id=pending.request_id, model="policy", finish_reason="stop", prompt_tokens=5, completion_tokens=3
    )
    endpoint.answer(pending.request_id, 200, body)
    return pending.request_id


async def test_a_streamed_call_reads_as_the_reply_in_openais_client(endpoint: ModelEndpoint) -> None:
    async with httpx.AsyncClient(transport=transport(endpoint)) as http:
        client = AsyncOpenAI(base_url="http://harness/v1", api_key=KEY, http_client=http, max_retries=0)

        async def streamed() -> list:
            stream = await client.chat.completions.create(
                model="policy", messages=[{"role": "user", "content": "list the files"}], stream=True
            )
            return [chunk async for chunk in stream]

        chunks, _ = await asyncio.gather(streamed(), answer_next(endpoint))
    deltas = [chunk.choices[0].delta for chunk in chunks if chunk.choices]
    assert "".join(d.content or "" for d in deltas) == "Listing."
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_1", "bash", {"command": "ls"})
    ]
    assert [chunk.choices[0].finish_reason for chunk in chunks if chunk.choices][-1] == "tool_calls"
    assert endpoint.calls == 1


async def test_a_request_sent_again_after_its_client_gave_up_costs_no_second_call(endpoint: ModelEndpoint) -> None:
    body = {"model": "policy", "messages": [{"role": "user", "content": "list the files"}]}
    headers = {"Authorization": f"Bearer {KEY}"}
    async with httpx.AsyncClient(transport=transport(endpoint), base_url="http://harness") as http:
        with pytest.raises(httpx.ReadTimeout):
            await http.post("/v1/chat/completions", json=body, headers=headers, timeout=0.5)
        again = asyncio.create_task(http.post("/v1/chat/completions", json=body, headers=headers, timeout=10))
        await asyncio.sleep(0.5)
        assert endpoint.calls == 1, "the retry waits on the request its first try left"
        await answer_next(endpoint)
        reply = (await again).raise_for_status().json()
    assert reply["choices"][0]["message"]["content"] == "Listing."
    assert await endpoint.next(0, asyncio.Event()) is None, "nothing is left for the workflow to take"
