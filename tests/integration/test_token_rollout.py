"""Token-exact rollouts with a real model: SmolLM2-135M-Instruct behind a real SGLang-shaped
`/generate` server (temporal_rollouts/policy_servers/cpu_generate.py), driven through the real worker,
dev server, sandbox and demo policy.

The tiny model cannot choose tools, so the policy is steered: each turn starts with the
demo policy's reply forced in (masked: the model did not write it) and the model
writes the rest of the turn. What is checked is what a trainer relies on: the unmasked
positions are exactly the tokens the server sampled, and their logprobs are what a
fresh forward pass of the model gives for that very sequence.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, RolloutLimits, Sampling, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.token_trace import IGNORE_INDEX, NOT_GENERATED_LOGPROB
from temporal_rollouts.policy_servers import smollm2
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support.servers.fixtures import LOGPROB_TOLERANCE, GenerateServerProcess, generate_policy
from tests.support.waiting import batch_id
from temporal_rollouts.runtime.worker import Parts
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow


@pytest.fixture
def smol(settings: Settings, smollm2_server: GenerateServerProcess) -> Iterator[str]:
    """The real model as the policy `smol` of the worker's settings."""
    settings.policies["smol"] = generate_policy(smollm2_server)
    yield "smol"
    settings.policies.pop("smol", None)


def served(server: GenerateServerProcess) -> list[dict]:
    return httpx.get(f"{server.url}/requests", timeout=10).raise_for_status().json()


@pytest.mark.timeout(600)
async def test_a_steered_multi_turn_rollout_yields_the_models_exact_tokens_and_logprobs(
    client: Client,
    settings: Settings,
    parts: Parts,
    smol: str,
    smollm2_server: GenerateServerProcess,
    smollm2_model,
    smollm2_tokenizer,
) -> None:
    httpx.post(f"{smollm2_server.url}/requests/reset", timeout=10).raise_for_status()
    result = await client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(
            env="echo_chain",
            env_config={"steps": 2},
            num_items=1,
            group_size=1,
            policy=smol,
            sampling=Sampling(temperature=1.0, max_tokens=8),
            limits=RolloutLimits(max_turns=4),
        ),
        id=batch_id("tokens"),
        task_queue=settings.temporal.task_queue,
    )
    assert result.completed == 1, result
    group = read_groups(Path(result.output))[0]
    rollout = await client.get_workflow_handle(
        group["metadata"]["rollout_ids"][0], result_type=TrajectoryResult
    ).result()
    assert rollout.turns >= 3 and rollout.tool_calls >= 2, "two steered tool-call turns, then the last reply"
    assert rollout.tokens is not None and rollout.tokens.restarts == 0
    trace = await parts.traces.load(rollout.tokens)

    # every /generate request continued the one sequence, and what it sampled is what is unmasked
    requests = served(smollm2_server)
    assert len(requests) == rollout.turns
    generated_at: set[int] = set()
    for request in requests:
        start = len(request["input_ids"])
        assert trace.tokens[:start] == request["input_ids"], "each turn's prompt is the sequence so far"
        assert trace.tokens[start : start + len(request["output_ids"])] == request["output_ids"]
        generated_at |= set(range(start, start + len(request["output_ids"])))
    masks = trace.masks()
    assert {i for i, m in enumerate(masks) if m != IGNORE_INDEX} == generated_at
    assert all(masks[i] == trace.tokens[i] for i in generated_at)

    # the logprobs are the model's own, for this exact sequence
    fresh = smollm2.forward_logprobs(smollm2_model, trace.tokens)
    worst = max(abs(trace.logprobs[i] - fresh[i - 1]) for i in generated_at)
    assert worst < LOGPROB_TOLERANCE, f"logprob mismatch up to {worst:.2e}"
    print(f"\n{rollout.turns} turns, {len(trace)} tokens, {len(generated_at)} generated; worst logprob gap {worst:.1e}")

    # the scored group carries the same sequence, mask and logprobs by value
    assert group["tokens"] == [trace.tokens]
    assert group["masks"] == [masks]
    assert group["inference_logprobs"] == [[NOT_GENERATED_LOGPROB if lp is None else lp for lp in trace.logprobs]]
    text = smollm2_tokenizer.decode(trace.tokens)
    assert "<tool_call>" in text and "step-1" in text and "<tool_response>" in text


@pytest.mark.parametrize("api", ["sglang", "vllm"])
async def test_both_generate_shapes_read_the_real_servers_tokens_and_logprobs(
    api: str,
    smollm2_server: GenerateServerProcess,
    smollm2_model,
    smollm2_tokenizer,
) -> None:
    from temporal_rollouts.llm.generate import GenerateClient

    text = smollm2_tokenizer.apply_chat_template(
        [{"role": "user", "content": "Name a colour."}], add_generation_prompt=True, tokenize=False
    )
    prompt = smollm2_tokenizer(text, add_special_tokens=False)["input_ids"]
    client = GenerateClient(smollm2_server.url + "/v1", api)
    try:
        generation = await client.generate(
            prompt, max_tokens=10, temperature=0.0, stop_token_ids=[smollm2_tokenizer.eos_token_id]
        )
    finally:
        await client.aclose()
    assert 0 < len(generation.ids) <= 10
    fresh = smollm2.forward_logprobs(smollm2_model, prompt + generation.ids)[len(prompt) - 1 :]
    assert max(abs(a - b) for a, b in zip(generation.logprobs, fresh)) < LOGPROB_TOLERANCE
    last = served(smollm2_server)[-1]
    assert last["output_ids"] == generation.ids and last["input_ids"] == prompt
