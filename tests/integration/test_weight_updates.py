"""SGLang's `update_weights_from_disk` on the CPU generate server, with the real model: an update
changes what is generated and the `weight_version` every answer and record carries; a request in
flight during an update is served whole by the weights it started on; a refused update leaves the
served weights alone.

These tests change the weights a server serves, so they run their own server, not the session's.
"""

from __future__ import annotations

import copy
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from temporal_rollouts.policy_servers.smollm2 import forward_logprobs  # noqa: E402
from temporal_rollouts.policy_servers.weights import save_weights  # noqa: E402
from tests.support.servers.fixtures import (  # noqa: E402
    LOGPROB_TOLERANCE,
    OWN_SERVER_MAX_NEW_TOKENS,
    GenerateServerProcess,
)

# The first test carries the module's server and checkpoints in its time (58 s of setup alone on a quiet
# machine); beside three other test workers that ran past the default 300 s once, in a clean-clone CI run.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

LONG_REPLY_TOKENS = 160
"""Long enough (seconds on two cores) for an update to arrive while the request is in flight."""
assert LONG_REPLY_TOKENS <= OWN_SERVER_MAX_NEW_TOKENS, "the server would cut the long reply short"


@pytest.fixture(scope="module")
def server(own_smollm2_server: GenerateServerProcess) -> GenerateServerProcess:
    return own_smollm2_server


@pytest.fixture(scope="module")
def nudged(smollm2_model):
    """SmolLM2 with every weight moved by 5% of its own spread (fixed seed)."""
    model = copy.deepcopy(smollm2_model)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn(param.shape, generator=generator) * 0.05 * param.std())
    return model


@pytest.fixture(scope="module")
def checkpoints(smollm2_model, nudged, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("checkpoints")
    return {
        "original": save_weights(smollm2_model, folder / "original"),
        "nudged": save_weights(nudged, folder / "nudged"),
    }


@pytest.fixture(scope="module")
def prompt(smollm2_tokenizer) -> list[int]:
    messages = [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}]
    return smollm2_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)


def update(server: GenerateServerProcess, model_path: Path | str, version: str | int | None) -> httpx.Response:
    body = {"model_path": str(model_path), **({} if version is None else {"weight_version": version})}
    return httpx.post(f"{server.url}/update_weights_from_disk", json=body, timeout=600)


def generate(server: GenerateServerProcess, prompt: list[int], new_tokens: int = 8) -> dict:
    body = {
        "input_ids": prompt,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True},
    }
    response = httpx.post(f"{server.url}/generate", json=body, timeout=600)
    assert response.status_code == 200, response.text
    return response.json()


def served_by(model, prompt: list[int], answer: dict) -> float:
    """The largest gap between the answer's logprobs and what `model` gives for the same tokens."""
    logprobs = [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
    fresh = forward_logprobs(model, prompt + answer["output_ids"])[len(prompt) - 1 :]
    return max(abs(a - b) for a, b in zip(logprobs, fresh))


def version_of(server: GenerateServerProcess) -> str:
    return httpx.get(f"{server.url}/get_weight_version", timeout=10).raise_for_status().json()["weight_version"]


def test_an_update_changes_generation_and_the_version_every_answer_reports(
    server: GenerateServerProcess,
    checkpoints: dict[str, Path],
    smollm2_model,
    nudged,
    prompt: list[int],
) -> None:
    assert version_of(server) == "default"
    before = generate(server, prompt)
    assert before["meta_info"]["weight_version"] == "default"
    assert served_by(smollm2_model, prompt, before) < LOGPROB_TOLERANCE

    response = update(server, checkpoints["nudged"], 1)
    assert response.status_code == 200, response.text
    assert response.json() == {
        "success": True,
        "num_paused_requests": 0,
        "message": "Succeeded to update model weights. Weight version updated to 1.",
    }
    assert version_of(server) == "1"
    info = httpx.get(f"{server.url}/get_model_info", timeout=10).json()
    assert (info["weight_version"], info["model_path"]) == ("1", str(checkpoints["nudged"]))
    assert info["is_generation"] is True

    after = generate(server, prompt)
    assert after["meta_info"]["weight_version"] == "1"
    assert served_by(nudged, prompt, after) < LOGPROB_TOLERANCE, "the new weights serve, exactly"
    assert served_by(smollm2_model, prompt, after) > 0.05, "and they are not the old ones"
    vllm = httpx.post(
        f"{server.url}/generate",
        timeout=600,
        json={"prompt": {"prompt_token_ids": prompt}, "logprobs": 0, "max_tokens": 4, "temperature": 0},
    ).json()
    assert vllm["weight_version"] == "1"
    assert vllm["token_ids"] == [after["output_ids"][:4]]
    records = httpx.get(f"{server.url}/requests", timeout=10).json()
    assert [r["weight_version"] for r in records[-3:]] == ["default", "1", "1"]

    refused = update(server, checkpoints["nudged"].parent / "nowhere", 2)
    assert refused.status_code == 400 and refused.json()["success"] is False
    assert "nowhere" in refused.json()["message"]
    assert version_of(server) == "1"
    assert served_by(nudged, prompt, generate(server, prompt)) < LOGPROB_TOLERANCE


def test_a_request_in_flight_during_an_update_is_served_whole_by_the_weights_it_started_on(
    server: GenerateServerProcess,
    checkpoints: dict[str, Path],
    smollm2_model,
    nudged,
    prompt: list[int],
) -> None:
    assert update(server, checkpoints["original"], "a").json()["success"]

    def long_request() -> tuple[dict, float]:
        answer = generate(server, prompt, LONG_REPLY_TOKENS)
        return answer, time.monotonic()

    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(long_request)
        time.sleep(3.0)
        assert not in_flight.done(), "the long request ended before the update could meet it"
        response = update(server, checkpoints["nudged"], "b")
        updated_at = time.monotonic()
        answer, answered_at = in_flight.result()

    assert response.json()["success"], response.text
    assert answered_at <= updated_at, "the update waited for the request in flight"
    assert answer["meta_info"]["weight_version"] == "a"
    assert len(answer["output_ids"]) == LONG_REPLY_TOKENS
    assert served_by(smollm2_model, prompt, answer) < LOGPROB_TOLERANCE, "every token came from the old weights"
    following = generate(server, prompt)
    assert following["meta_info"]["weight_version"] == "b"
    assert served_by(nudged, prompt, following) < LOGPROB_TOLERANCE


def test_requests_sharing_a_cached_prompt_across_updates_report_the_weights_that_made_them(
    server: GenerateServerProcess,
    checkpoints: dict[str, Path],
    smollm2_model,
    nudged,
    prompt: list[int],
) -> None:
    """A group's rollouts send one prompt; the server reuses its KV cache. Updates land between and during
    them: every answer's logprobs are those of the weights its version names (a cache kept across an update
    would answer the new version with the old weights' prompt), within 1e-4 of one fresh forward pass."""
    assert update(server, checkpoints["original"], 0).json()["success"]
    models = {"0": smollm2_model, "1": nudged}
    answers: list[dict] = []

    def sample() -> None:
        for _ in range(3):
            answers.append(generate(server, prompt, 24))

    with ThreadPoolExecutor(2) as pool:
        senders = [pool.submit(sample), pool.submit(sample)]
        for version, name in (("1", "nudged"), ("0", "original"), ("1", "nudged")):
            time.sleep(1.0)
            assert update(server, checkpoints[name], version).json()["success"]
        for sender in senders:
            sender.result()
    cached = [a for a in answers if a["meta_info"]["cached_tokens"] > 0]
    assert cached, "the group's prompt came from the cache at least once"
    assert {a["meta_info"]["weight_version"] for a in answers} == {"0", "1"}
    for answer in answers:
        assert served_by(models[answer["meta_info"]["weight_version"]], prompt, answer) <= 1e-4
