"""A harness's chat-completions request read as a model turn, and the reply written back."""

from __future__ import annotations

import json

import pytest

from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall
from temporal_rollouts.llm.harness_wire import BadHarnessRequest, completion, extends, parse_request

BASH = {
    "type": "function",
    "function": {
        "name": "bash",
        "description": "run",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    },
}


def request(*messages: dict, **fields) -> dict:
    return {"model": "policy", "messages": list(messages), "tools": [BASH], **fields}


def test_a_request_becomes_messages_tools_and_the_harness_cap() -> None:
    parsed = parse_request(
        request(
            {"role": "developer", "content": "be brief"},
            {"role": "user", "content": [{"type": "text", "text": "fix "}, {"type": "text", "text": "it"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
                ],
                "provider_specific_fields": {"ignored": True},
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
            max_completion_tokens=64,
            temperature=0.2,
        )
    )
    assert [m.role for m in parsed.messages] == ["system", "user", "assistant", "tool"]
    assert parsed.messages[1].content == "fix it"
    assert json.loads(parsed.messages[2].tool_calls[0].function.arguments) == {"command": "ls"}
    assert parsed.messages[3].tool_call_id == "c1"
    assert [t.name for t in parsed.tools] == ["bash"] and parsed.max_tokens == 64


@pytest.mark.parametrize(
    ("body", "said"),
    [
        ([], "JSON object"),
        ({"messages": []}, "non-empty list"),
        (request({"role": "user", "content": "x"}, n=2), "`n` must be 1"),
        (request({"role": "function", "content": "x"}), "role must be one of"),
        (request({"role": "user", "content": [{"type": "image_url", "image_url": {}}]}), "only text parts"),
        (request({"role": "user", "content": "x"}, max_tokens=0), "positive integer"),
        ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}, "function tool"),
        (request({"role": "assistant", "tool_calls": [{"function": {"name": "bash"}}]}), ".id must be"),
    ],
)
def test_a_malformed_request_is_refused_with_what_is_wrong(body, said: str) -> None:
    with pytest.raises(BadHarnessRequest, match=said):
        parse_request(body)


def reply(arguments: str = '{"command": "ls", "timeout": 5}') -> Message:
    return Message(
        role="assistant",
        content=None,
        reasoning_content="I should look first.",
        tool_calls=[ToolCall(id="c1", function=FunctionCall(name="bash", arguments=arguments))],
    )


def test_a_request_that_echoes_the_reply_back_extends_the_conversation() -> None:
    sequence = [Message(role="system", content="s"), Message(role="user", content="task"), reply()]
    echoed = parse_request(
        request(
            {"role": "system", "content": "s"},
            {"role": "user", "content": "task"},
            # content "" for None, arguments re-serialised in another key order, the reasoning dropped
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "c1",
                        "type": "function",
                        "function": {"name": "bash", "arguments": '{"timeout":5,"command":"ls"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "c1", "content": "a.py"},
        )
    ).messages
    assert extends(sequence, echoed)


def test_a_request_that_rewrites_history_or_adds_nothing_does_not_extend() -> None:
    sequence = [Message(role="user", content="task"), reply()]
    trimmed = [Message(role="user", content="task (summarised)"), reply(), Message(role="user", content="go on")]
    edited = [Message(role="user", content="task"), reply('{"command": "rm -rf /"}'), Message(role="user", content="x")]
    assert not extends(sequence, trimmed)
    assert not extends(sequence, edited)
    assert not extends(sequence, sequence), "a request must add to the conversation"
    assert not extends(sequence, sequence[:1])


def test_the_reply_is_written_as_a_chat_completion_with_its_reasoning() -> None:
    body = completion(
        reply(), request_id="r7", model="policy", finish_reason="stop", prompt_tokens=10, completion_tokens=4
    )
    choice = body["choices"][0]
    assert body["object"] == "chat.completion" and body["id"] == "chatcmpl-r7"
    assert choice["finish_reason"] == "tool_calls"
    assert choice["message"]["tool_calls"][0]["function"] == {
        "name": "bash",
        "arguments": '{"command": "ls", "timeout": 5}',
    }
    assert choice["message"]["reasoning_content"] == "I should look first."
    assert body["usage"] == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14}
    final = completion(
        Message(role="assistant", content="Done."),
        request_id="r8",
        model="policy",
        finish_reason="length",
        prompt_tokens=None,
        completion_tokens=None,
    )
    assert final["choices"][0]["finish_reason"] == "length" and "tool_calls" not in final["choices"][0]["message"]
