"""The token-level client (llm.token_client) with SmolLM2's real tokenizer and a real
chat template that renders tools (Qwen2.5's: both are ChatML), and `/generate` faked at
the transport seam (httpx.MockTransport) so each case controls exactly what the model
"sampled". The same client against the real model is in tests/test_token_rollout.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from temporal_rollouts.core.errors import ContextOverflow, MalformedModelReply, ModelUnavailable
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall, ToolSpec
from temporal_rollouts.core.token_trace import IGNORE_INDEX, NOT_GENERATED_LOGPROB, TokenTrace
from temporal_rollouts.llm.generate import GenerateClient
from temporal_rollouts.llm.templates import ChatTemplate
from temporal_rollouts.llm.token_client import TokenClient
from tests.support import TEMPLATES

QWEN_TEMPLATE = TEMPLATES / "qwen2_5.jinja"
TOOLS = [
    ToolSpec(
        name="terminal",
        description="Run a shell command.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]},
    )
]
CALL_TEXT = '<tool_call>\n{"name": "terminal", "arguments": {"command": "ls"}}\n</tool_call>'


@pytest.fixture(scope="module")
def template(smollm2_tokenizer_dir: Path) -> ChatTemplate:
    return ChatTemplate.load(str(smollm2_tokenizer_dir), str(QWEN_TEMPLATE))


class ScriptedGenerate:
    """Answers /generate with the next scripted text as sampled token ids, logprob -0.25 + i/1000 each."""

    def __init__(
        self, template: ChatTemplate, replies: list[str], shape: str = "sglang", weight_version: str | None = None
    ) -> None:
        self.template, self.replies, self.shape = template, list(replies), shape
        self.weight_version = weight_version
        self.requests: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.requests.append(body)
        ids = self.template.encode(self.replies.pop(0))
        limit = body["sampling_params"]["max_new_tokens"] if self.shape == "sglang" else body["max_tokens"]
        finish = "length" if len(ids) > limit else "stop"
        ids = ids[:limit]
        logprobs = [-0.25 + i / 1000 for i in range(len(ids))]
        version = {} if self.weight_version is None else {"weight_version": self.weight_version}
        if self.shape == "sglang":
            return httpx.Response(
                200,
                json={
                    "meta_info": {
                        "finish_reason": {"type": finish},
                        **version,
                        "output_token_logprobs": [[lp, t, None] for lp, t in zip(logprobs, ids)],
                    }
                },
            )
        return httpx.Response(
            200,
            json={
                "logprobs": [[[{str(t): lp}] for t, lp in zip(ids, logprobs)]],
                "finish_reasons": [finish],
                **version,
            },
        )

    def client(self, parser: str = "hermes") -> TokenClient:
        generator = GenerateClient("http://model/v1", self.shape, transport=httpx.MockTransport(self))
        return TokenClient(self.template, generator, parser)


def _start() -> list[Message]:
    return [Message(role="system", content="You fix builds."), Message(role="user", content="List the files.")]


def _extend(trace: TokenTrace, added: TokenTrace) -> TokenTrace:
    return TokenTrace(tokens=trace.tokens + added.tokens, logprobs=trace.logprobs + added.logprobs)


async def _two_turns(template: ChatTemplate, shape: str = "sglang"):
    script = ScriptedGenerate(template, [CALL_TEXT + "<|im_end|>", "Two files.<|im_end|>"], shape)
    client = script.client()
    messages = _start()
    first = await client.turn(
        messages, TOOLS, prior=None, prior_messages=0, temperature=1.0, max_tokens=64, context_tokens=4096
    )
    call = first.message.tool_calls[0]
    messages += [first.message, Message(role="tool", tool_call_id=call.id, content="a.txt\nb.txt")]
    second = await client.turn(
        messages, TOOLS, prior=first.added, prior_messages=3, temperature=1.0, max_tokens=64, context_tokens=4096
    )
    return script, messages + [second.message], first, second


@pytest.mark.parametrize("shape", ["sglang", "vllm"])
async def test_two_turns_make_one_sequence_that_reads_as_the_template_renders_it(
    template: ChatTemplate, shape: str
) -> None:
    script, messages, first, second = await _two_turns(template, shape)
    assert first.message.tool_calls[0].function.name == "terminal"
    assert json.loads(first.message.tool_calls[0].function.arguments) == {"command": "ls"}
    assert second.message.content == "Two files." and not second.restarted
    trace = _extend(first.added, second.added)
    assert template.decode(trace.tokens) == template.render(messages, TOOLS, add_generation_prompt=False)
    # the second request carried the first turn's tokens verbatim, then only the new ones
    second_prompt = (
        script.requests[1]["input_ids"] if shape == "sglang" else script.requests[1]["prompt"]["prompt_token_ids"]
    )
    assert second_prompt[: len(first.added)] == first.added.tokens
    assert second_prompt == trace.tokens[: len(second_prompt)]


@pytest.mark.parametrize("shape", ["sglang", "vllm"])
async def test_a_turn_carries_the_weight_version_the_server_reports(template: ChatTemplate, shape: str) -> None:
    for version in ["7", None]:
        client = ScriptedGenerate(template, ["Hi.<|im_end|>"], shape, weight_version=version).client()
        turn = await client.turn(
            _start(), TOOLS, prior=None, prior_messages=0, temperature=1.0, max_tokens=8, context_tokens=4096
        )
        assert turn.weight_version == version


async def test_only_the_sampled_tokens_are_unmasked_with_their_logprobs(template: ChatTemplate) -> None:
    _, _, first, second = await _two_turns(template)
    trace = _extend(first.added, second.added)
    sampled = template.encode(CALL_TEXT + "<|im_end|>") + template.encode("Two files.<|im_end|>")
    masks = trace.masks()
    assert [t for t in masks if t != IGNORE_INDEX] == sampled
    assert all(m in (IGNORE_INDEX, t) for m, t in zip(masks, trace.tokens))
    logprobs = trace.inference_logprobs()
    assert len(logprobs) == len(trace.tokens)
    generated = [lp for lp, m in zip(logprobs, masks) if m != IGNORE_INDEX]
    expected = [-0.25 + i / 1000 for i in range(len(template.encode(CALL_TEXT + "<|im_end|>")))]
    assert generated[: len(expected)] == expected
    assert all(lp == NOT_GENERATED_LOGPROB for lp, m in zip(logprobs, masks) if m == IGNORE_INDEX)
    # the template's "\n" after <|im_end|> is glue the model did not write
    assert masks[len(first.added) - 1] == IGNORE_INDEX


async def test_a_reply_cut_off_by_the_token_limit_is_closed_and_the_sequence_goes_on(template: ChatTemplate) -> None:
    script = ScriptedGenerate(template, ["A very long answer that goes on and on<|im_end|>", "Done.<|im_end|>"])
    client = script.client()
    messages = _start()
    first = await client.turn(
        messages, TOOLS, prior=None, prior_messages=0, temperature=1.0, max_tokens=4, context_tokens=4096
    )
    assert first.finish_reason == "length" and first.completion_tokens == 4
    assert first.added.tokens[-len(template.encode(template.end_of_turn)) :] == template.encode(template.end_of_turn)
    messages += [first.message, Message(role="user", content="Go on.")]
    second = await client.turn(
        messages, TOOLS, prior=first.added, prior_messages=3, temperature=1.0, max_tokens=8, context_tokens=4096
    )
    assert not second.restarted and second.message.content == "Done."


async def test_forced_prefill_is_in_the_sequence_but_masked(template: ChatTemplate) -> None:
    script = ScriptedGenerate(template, ["<|im_end|>"])
    client = script.client()
    steer = Message(
        role="assistant",
        tool_calls=[ToolCall(id="c1", function=FunctionCall(name="terminal", arguments='{"command": "ls"}'))],
    )
    turn = await client.turn(
        _start(), TOOLS, prior=None, prior_messages=0, temperature=1.0, max_tokens=8, context_tokens=4096, prefill=steer
    )
    assert [c.function.name for c in turn.message.tool_calls] == ["terminal"]
    masks = turn.added.masks()
    assert [t for t in masks if t != IGNORE_INDEX] == template.encode("<|im_end|>"), "only the sampled token is trained"
    assert CALL_TEXT in template.decode(turn.added.tokens)


async def test_a_template_that_rewrites_history_restarts_the_sequence(template: ChatTemplate, tmp_path: Path) -> None:
    last_two = tmp_path / "last_two.jinja"
    last_two.write_text(
        "{% for m in messages[-2:] %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
    rewriting = ChatTemplate(template.tokenizer, last_two.read_text())
    script = ScriptedGenerate(rewriting, ["One.<|im_end|>", "Two.<|im_end|>"])
    client = script.client()
    messages = _start()
    first = await client.turn(
        messages, [], prior=None, prior_messages=0, temperature=1.0, max_tokens=8, context_tokens=4096
    )
    messages += [first.message, Message(role="user", content="And?")]
    second = await client.turn(
        messages, [], prior=first.added, prior_messages=3, temperature=1.0, max_tokens=8, context_tokens=4096
    )
    assert second.restarted
    assert rewriting.decode(second.added.tokens).startswith(rewriting.render(messages, [], add_generation_prompt=True))


async def test_an_overflowing_context_is_fitted_and_restarts_the_sequence(template: ChatTemplate) -> None:
    script = ScriptedGenerate(template, ["Done.<|im_end|>"])
    client = script.client()
    messages = _start()
    for turn in range(12):
        call = ToolCall(id=f"c{turn}", function=FunctionCall(name="terminal", arguments='{"command": "cat log"}'))
        messages += [
            Message(role="assistant", tool_calls=[call]),
            Message(role="tool", tool_call_id=f"c{turn}", content="line\n" * 150),
        ]
    full = template.count(messages, TOOLS)
    turn = await client.turn(
        messages, TOOLS, prior=None, prior_messages=0, temperature=1.0, max_tokens=16, context_tokens=full // 2
    )
    assert turn.restarted and len(turn.added) <= full // 2
    assert "...[truncated]..." in template.decode(turn.added.tokens)
    with pytest.raises(ContextOverflow):
        await client.turn(
            messages, TOOLS, prior=None, prior_messages=0, temperature=1.0, max_tokens=16, context_tokens=200
        )


async def test_server_errors_are_typed(template: ChatTemplate) -> None:
    def failing(status: int, body: object):
        return GenerateClient(
            "http://model", "sglang", transport=httpx.MockTransport(lambda r: httpx.Response(status, json=body))
        )

    with pytest.raises(ModelUnavailable):
        await failing(503, {"error": "overloaded"}).generate([1, 2], max_tokens=4, temperature=1.0, stop_token_ids=[2])
    with pytest.raises(MalformedModelReply, match="sglang shape"):
        await failing(200, {"text": "hi"}).generate([1, 2], max_tokens=4, temperature=1.0, stop_token_ids=[2])
