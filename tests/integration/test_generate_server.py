"""The generate server with a real model: sampled tokens come back with the logprobs a
fresh forward pass gives, in both SGLang's and Atropos/vLLM's `/generate` shapes.

Logprobs are compared with an absolute tolerance of 1e-3: the server decodes one token
at a time over a KV cache while `forward_logprobs` runs the whole sequence at once, so
float32 sums are taken in a different order (differences of ~1e-5). Any real mistake
(an off-by-one position, temperature-scaled or top-p-renormalized logprobs) moves them
by far more than 1e-3.
"""

from __future__ import annotations

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from temporal_rollouts.policy_servers.smollm2 import forward_logprobs  # noqa: E402

pytestmark = pytest.mark.slow

LOGPROB_TOLERANCE = 1e-3
SEED = 1234
NEW_TOKENS = 12


def post(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/generate", json=body, timeout=600)


def chat_ids(tokenizer, question: str) -> list[int]:
    messages = [{"role": "user", "content": question}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def assert_forward_logprobs(model, prompt_ids: list[int], output_ids: list[int], logprobs: list[float]) -> None:
    expected = forward_logprobs(model, prompt_ids + output_ids)[len(prompt_ids) - 1 :]
    assert len(logprobs) == len(expected) == len(output_ids)
    worst = max(abs(got - want) for got, want in zip(logprobs, expected))
    assert worst < LOGPROB_TOLERANCE, (logprobs, expected)


@pytest.fixture(scope="module")
def eos_ids(smollm2_tokenizer) -> set[int]:
    return {smollm2_tokenizer.eos_token_id, smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")}


@pytest.fixture(scope="module")
def story_ids(smollm2_tokenizer) -> list[int]:
    return chat_ids(smollm2_tokenizer, "Tell me a long story about a lighthouse keeper.")


@pytest.fixture(scope="module")
def sglang_sample(smollm2_server, story_ids) -> dict:
    body = {
        "input_ids": story_ids,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "seed": SEED},
        "return_logprob": True,
    }
    response = post(smollm2_server, body)
    assert response.status_code == 200, response.text
    return response.json()


def test_sglang_shape_returns_forward_pass_logprobs(
    smollm2_model, sglang_sample, story_ids, smollm2_tokenizer, eos_ids
) -> None:
    meta = sglang_sample["meta_info"]
    output_ids = sglang_sample["output_ids"]
    assert [entry[1] for entry in meta["output_token_logprobs"]] == output_ids
    assert all(entry[2] is None for entry in meta["output_token_logprobs"])
    assert meta["prompt_tokens"] == len(story_ids)
    assert meta["completion_tokens"] == len(output_ids)
    if output_ids[-1] in eos_ids and len(output_ids) < NEW_TOKENS:
        assert meta["finish_reason"] == {"type": "stop", "matched": output_ids[-1]}
    else:
        assert len(output_ids) == NEW_TOKENS
        assert meta["finish_reason"] == {"type": "length", "length": NEW_TOKENS}
    assert sglang_sample["text"] == smollm2_tokenizer.decode(output_ids, skip_special_tokens=True)
    logprobs = [entry[0] for entry in meta["output_token_logprobs"]]
    assert_forward_logprobs(smollm2_model, story_ids, output_ids, logprobs)


def test_vllm_shape_samples_the_same_tokens_for_the_same_seed(
    smollm2_server, sglang_sample, story_ids, smollm2_model, smollm2_tokenizer
) -> None:
    body = {
        "prompt": {"prompt_token_ids": story_ids},
        "logprobs": 0,
        "max_tokens": NEW_TOKENS,
        "temperature": 1.0,
        "n": 1,
        "seed": SEED,
    }
    response = post(smollm2_server, body)
    assert response.status_code == 200, response.text
    data = response.json()
    # What atroposlib's VLLMServer reads: one [{token_id: logprob}] per generated token.
    entries = [item[0] for item in data["logprobs"][0]]
    output_ids = [int(next(iter(entry))) for entry in entries]
    logprobs = [next(iter(entry.values())) for entry in entries]
    assert output_ids == sglang_sample["output_ids"] == data["token_ids"][0]
    assert data["finish_reasons"] == [sglang_sample["meta_info"]["finish_reason"]["type"]]
    assert data["text"] == [smollm2_tokenizer.decode(output_ids, skip_special_tokens=True)]
    assert_forward_logprobs(smollm2_model, story_ids, output_ids, logprobs)


def test_greedy_stops_on_im_end_and_keeps_it(smollm2_server, smollm2_model, smollm2_tokenizer) -> None:
    prompt = chat_ids(smollm2_tokenizer, "What is 2+2?")
    im_end = smollm2_tokenizer.convert_tokens_to_ids("<|im_end|>")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 40, "temperature": 0}, "return_logprob": True}
    data = post(smollm2_server, body).json()
    output_ids = data["output_ids"]
    assert output_ids[-1] == im_end and im_end not in output_ids[:-1]
    assert data["meta_info"]["finish_reason"] == {"type": "stop", "matched": im_end}
    assert "<|im_end|>" not in data["text"]
    assert data["text"] == smollm2_tokenizer.decode(output_ids, skip_special_tokens=True)
    # Greedy or not, the logprobs are the raw temperature-1 ones.
    logprobs = [entry[0] for entry in data["meta_info"]["output_token_logprobs"]]
    assert_forward_logprobs(smollm2_model, prompt, output_ids, logprobs)

    stop_at = output_ids[2]
    body["sampling_params"]["stop_token_ids"] = [stop_at]
    stopped = post(smollm2_server, body).json()
    assert stopped["output_ids"] == output_ids[: output_ids.index(stop_at) + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}

    short = {"prompt": {"prompt_token_ids": prompt}, "logprobs": 0, "max_tokens": 3, "temperature": 0}
    data = post(smollm2_server, short).json()
    assert data["token_ids"] == [output_ids[:3]]
    assert data["finish_reasons"] == ["length"]


def test_health(smollm2_server) -> None:
    assert httpx.get(f"{smollm2_server.url}/health", timeout=10).json() == {"status": "ok"}


def test_a_request_without_input_ids_is_a_400(smollm2_server) -> None:
    response = post(smollm2_server, {"sampling_params": {"max_new_tokens": 4}, "return_logprob": True})
    assert response.status_code == 400
    assert "input_ids" in response.json()["error"]["message"]

    response = post(smollm2_server, {"prompt": {}, "logprobs": 0, "max_tokens": 4})
    assert response.status_code == 400
    assert "prompt_token_ids" in response.json()["error"]["message"]

    response = post(smollm2_server, {"input_ids": [1, 2], "sampling_params": {"max_token": 4}})
    assert response.status_code == 400
    assert "max_token" in response.json()["error"]["message"]


def test_a_prompt_shared_with_the_previous_request_is_reused_with_the_same_logprobs(
    smollm2_server, smollm2_model, smollm2_tokenizer
) -> None:
    prompt = chat_ids(smollm2_tokenizer, "Name three colours.")
    body = {"input_ids": prompt, "sampling_params": {"max_new_tokens": 6, "temperature": 0}, "return_logprob": True}
    first, again = post(smollm2_server, body).json(), post(smollm2_server, body).json()
    assert again["meta_info"]["cached_tokens"] == len(prompt) - 1, "all but the last prompt token reused"
    assert again["output_ids"] == first["output_ids"]
    logprobs = [entry[0] for entry in again["meta_info"]["output_token_logprobs"]]
    assert_forward_logprobs(smollm2_model, prompt, again["output_ids"], logprobs)

    longer = prompt + first["output_ids"]
    body["input_ids"] = longer
    continued = post(smollm2_server, body).json()
    assert continued["meta_info"]["cached_tokens"] == len(prompt)
    logprobs = [entry[0] for entry in continued["meta_info"]["output_token_logprobs"]]
    assert_forward_logprobs(smollm2_model, longer, continued["output_ids"], logprobs)
