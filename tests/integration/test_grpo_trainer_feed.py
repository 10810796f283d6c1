"""The GRPO example's trainer as Atropos sees it: `python -m examples.grpo.trainer` registers
with the real `run-api`, pulls a group the model itself sampled, trains one step on it and has
the CPU policy server serve the result as version 1.

The trainer changes the weights a server serves, so the test runs its own server.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("torch")
pytest.importorskip("atroposlib")

from tests.support import REPO  # noqa: E402
from tests.support.servers.fixtures import GenerateServerProcess  # noqa: E402
from tests.support.servers.run_api import RunApiProcess  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def server(own_smollm2_server: GenerateServerProcess) -> GenerateServerProcess:
    return own_smollm2_server


def sampled_group(server: GenerateServerProcess, tokenizer, size: int = 2) -> dict:
    """`size` replies of the served model to one prompt, as an Atropos group scored 1, 0, ..."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Say hello."}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    group = {"tokens": [], "masks": [], "inference_logprobs": [], "scores": [float(i == 0) for i in range(size)]}
    for seed in range(size):
        answer = httpx.post(
            f"{server.url}/generate",
            timeout=600,
            json={
                "input_ids": prompt,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 6, "temperature": 1.0, "seed": seed},
            },
        ).json()
        output, logprobs = answer["output_ids"], [entry[0] for entry in answer["meta_info"]["output_token_logprobs"]]
        group["tokens"].append(prompt + output)
        group["masks"].append([-100] * len(prompt) + output)
        group["inference_logprobs"].append([1.0] * len(prompt) + logprobs)
    return group


@pytest.mark.timeout(900)
def test_the_trainer_pulls_from_run_api_and_the_server_serves_its_step(
    run_api: RunApiProcess, server: GenerateServerProcess, smollm2_tokenizer, tmp_path: Path
) -> None:
    group = sampled_group(server, smollm2_tokenizer)
    stats = tmp_path / "stats.jsonl"
    log = tmp_path / "trainer.log"
    with open(log, "wb") as out:
        trainer = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "examples.grpo.trainer",
                "--run-api",
                run_api.url,
                "--policy-server",
                server.url,
                "--batch-size",
                "2",
                "--steps",
                "1",
                "--checkpoints",
                str(tmp_path / "checkpoints"),
                "--stats",
                str(stats),
                "--lr",
                "1e-5",
            ],
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "HF_HUB_OFFLINE": "1"},
        )
    try:
        deadline = time.monotonic() + 600
        while httpx.get(f"{run_api.url}/info", timeout=10).json()["batch_size"] != 2:
            assert trainer.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        httpx.post(f"{run_api.url}/scored_data", json=group, timeout=30).raise_for_status()
        assert trainer.wait(600) == 0, log.read_text()[-3000:]
    finally:
        if trainer.poll() is None:
            trainer.kill()

    step = json.loads(stats.read_text().splitlines()[0])
    assert (step["step"], step["sequences"], step["mean_reward"]) == (1, 2, 0.5)
    assert step["logprob_gap_max"] < 1e-3, "the trainer recomputes the server's logprobs"
    assert httpx.get(f"{server.url}/get_weight_version", timeout=10).json() == {"weight_version": "1"}
    info = httpx.get(f"{server.url}/get_model_info", timeout=10).json()
    assert info["model_path"] == str((tmp_path / "checkpoints" / "step-00001").resolve())
