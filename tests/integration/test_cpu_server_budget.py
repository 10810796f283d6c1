"""The CPU policy server on a user's CPU run: a request that asks for its whole context budget is
served up to the server's cap (`--max-new-tokens`, 128 by default) and ends with "length", so a
rollout finishes; and SIGTERM ends the server promptly even while it generates (uvicorn alone
waited for the request, minutes on a CPU). The server here caps at 16 tokens, to stay quick."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.servers.fixtures import GenerateServerProcess

pytest.importorskip("torch")

pytestmark = pytest.mark.slow

CAP = 16
PROMPT = [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411, 407, 19712, 8182, 2]


TOOK_S: dict[str, float] = {}
"""How long the whole cap took, for the next test's timing."""


def generate(server: GenerateServerProcess, max_new_tokens: int) -> httpx.Response:
    body = {
        "input_ids": PROMPT,
        "return_logprob": True,
        "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 1.0, "ignore_eos": True, "seed": 7},
    }
    return httpx.post(f"{server.url}/generate", json=body, timeout=600)


@pytest.fixture(scope="module")
def server(smollm2_gguf, tmp_path_factory) -> Iterator[GenerateServerProcess]:
    server = GenerateServerProcess(
        smollm2_gguf, tmp_path_factory.mktemp("capped_server"), ("--max-new-tokens", str(CAP), "--threads", "1")
    )
    server.start()
    server.wait_ready()
    yield server
    server.stop()


def test_a_request_for_thousands_of_tokens_gets_the_servers_cap_and_length(server: GenerateServerProcess) -> None:
    started = time.monotonic()
    answer = generate(server, 8000).raise_for_status().json()
    TOOK_S["cap"] = time.monotonic() - started
    assert len(answer["output_ids"]) == CAP
    assert answer["meta_info"]["finish_reason"] == {"type": "length", "length": CAP}


def test_sigterm_ends_the_server_while_it_generates(server: GenerateServerProcess) -> None:
    answers: list[httpx.Response] = []
    request = threading.Thread(target=lambda: answers.append(generate(server, CAP)))
    request.start()
    time.sleep(TOOK_S.get("cap", 4.0) / 3)  # inside the generation: a third of what the whole cap took before
    signalled = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    server.proc.wait(30)
    took = time.monotonic() - signalled
    request.join(30)
    assert took < 5.0, f"the server took {took:.1f}s to stop"
    assert answers and answers[0].status_code == 503, answers
    assert "shutting down" in answers[0].json()["error"]["message"]
