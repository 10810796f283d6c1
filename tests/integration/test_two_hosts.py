"""Two worker hosts on one machine, sharing one pool through the static backend: a batch runs on both,
one host's worker and sandbox server are SIGKILLed mid-batch, and every rollout still finishes.

"Hosts" here are two `python worker.py` processes with their own data dirs and host names
(`worker.host_name`), each beside a sandbox server on its own loopback address (127.0.0.2,
127.0.0.3), with one Temporal dev server and S3 (the moto server) for payloads. Host A's sandbox
server comes back on its own disk after the kill, as Kubernetes restarts a pod with its volume;
host A's worker stays dead, so host B's worker finishes everything.
"""

from __future__ import annotations

import asyncio
import shutil
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.sandbox.backends.tokens import derive_token
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.support.processes import WorkerProcess
from tests.support.sandbox import executions_under
from tests.support.sandbox_process import SandboxProcess
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.servers.process import HOST, LoopbackServer
from tests.support.waiting import no_leases, wait_until
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

SECRET_ENV = "TWO_HOSTS_POOL_SECRET"
SECRET = "two-hosts-pool-secret-0123456789abcdef"
BUCKET = "rollouts-two-hosts"


@pytest.fixture
def s3_endpoint(tmp_path) -> Iterator[str]:
    moto = shutil.which("moto_server")
    if moto is None:
        pytest.skip("moto_server is not installed")
    server = LoopbackServer(tmp_path / "moto_server.log")
    server.what = "moto_server"
    server.launch([moto, "-H", HOST, "-p", str(server.port)])
    server.wait_ready()
    yield server.url
    server.stop()


@pytest.fixture
def sandboxes(tmp_path, monkeypatch) -> Iterator[dict[str, SandboxProcess]]:
    monkeypatch.setenv(SECRET_ENV, SECRET)
    started = {
        host: SandboxProcess(
            tmp_path / host / "sandbox",
            f"sandbox-{host}",
            derive_token(SECRET, f"sandbox-{host}"),
            host=address,
            slots=4,
        ).start()
        for host, address in (("host-a", "127.0.0.2"), ("host-b", "127.0.0.3"))
    }
    yield started
    for server in started.values():
        server.stop()


def host_settings(
    tmp_path: Path,
    host: str,
    client: Client,
    queue: str,
    s3: str,
    demo: DemoPolicyProcess,
    sandboxes: dict[str, SandboxProcess],
) -> Settings:
    servers = [{"container_id": s.container_id, "url": s.url} for s in sandboxes.values()]
    return Settings(
        data_dir=tmp_path / host / "data",
        temporal={"address": client.service_client.config.target_host, "task_queue": queue},
        demo_policy={"port": demo.port, "start_local": False},
        worker={"host_name": host},
        storage={"type": "s3", "endpoint_url": s3, "region": "us-east-1", "bucket": BUCKET},
        sandbox={
            "backend": {"type": "static", "servers": servers, "secret_env": SECRET_ENV},
            "slots_per_container": 4,
            "min_containers": 0,
            "max_containers": 2,
            "acquire_timeout_s": 180,
            "reap_interval_s": 2.0,
        },
    )


@pytest.fixture
async def workers(tmp_path, temporal_env, demo_policy, s3_endpoint, sandboxes, monkeypatch) -> AsyncIterator[dict]:
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    import aioboto3

    async with aioboto3.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1") as admin:
        await admin.create_bucket(Bucket=BUCKET)
    queue = f"two-hosts-{uuid.uuid4().hex[:6]}"
    made = {}
    for host in ("host-a", "host-b"):
        settings = host_settings(tmp_path, host, temporal_env.client, queue, s3_endpoint, demo_policy, sandboxes)
        settings.data_dir.mkdir(parents=True)
        made[host] = WorkerProcess(settings, tmp_path / host / "worker.log")
        made[host].start()
    for process in made.values():
        await asyncio.to_thread(process.wait_ready, 60)
    yield made
    for process in made.values():
        process.stop()


def executions(sandboxes: dict[str, SandboxProcess], prefix: str) -> Counter[str]:
    return Counter(e["call_id"] for server in sandboxes.values() for e in executions_under(server.root, prefix))


async def test_a_batch_on_two_hosts_survives_losing_one(tmp_path, workers, sandboxes, demo_policy) -> None:
    demo_policy.control(delay_s=0.3)
    settings_b = workers["host-b"].settings
    client = await connect(settings_b, start_embedded=False)
    batch = BatchInput(
        env="echo_chain", num_items=20, group_size=1, max_concurrency=8, env_config={"steps": 4, "sleep_s": 0.3}
    )
    handle = await client.start_workflow(
        BatchWorkflow.run, batch, id=f"two-hosts-{uuid.uuid4().hex[:6]}", task_queue=settings_b.temporal.task_queue
    )
    async with SandboxPool.from_settings(settings_b) as pool:

        async def both_servers_busy() -> bool:
            return {lease.container_id for lease in await pool.leases()} == {"sandbox-host-a", "sandbox-host-b"}

        await wait_until(both_servers_busy, timeout_s=60, interval_s=0.2)
        workers["host-a"].kill()  # host A is gone: its worker and its sandbox server, mid-batch
        sandboxes["host-a"].kill()
        assert not (await handle.describe()).status.name == "COMPLETED"
        await asyncio.sleep(3)
        sandboxes["host-a"].start()  # its orchestrator brings the server back on its own disk

        result = BatchResult.model_validate(await asyncio.wait_for(handle.result(), 300))
        assert (result.total, result.completed, result.failed, result.mean_score) == (20, 20, 0, 1.0)
        # A lease host A's worker took just before its SIGKILL is freed by host B's reaper (every 2 s) once its
        # holder has closed; on busy cores that took over 30 s once.
        await wait_until(lambda: no_leases(pool), timeout_s=120)
    ran = executions(sandboxes, f"{handle.id}/")
    assert ran and max(ran.values()) == 1, "a tool call ran twice"
    assert len({call.split("/")[1] for call in ran}) == 20
    assert await worker_hosts(client, handle.id, 20) == {"host-a", "host-b"}


async def worker_hosts(client: Client, batch_id: str, items: int) -> set[str]:
    """The hosts whose workers ran workflow tasks of the batch's rollouts, from their histories."""
    hosts = set()
    for index in range(items):
        history = await client.get_workflow_handle(f"{batch_id}/item-{index}/g0").fetch_history()
        for event in history.events:
            if event.HasField("workflow_task_started_event_attributes"):
                hosts.add(event.workflow_task_started_event_attributes.identity.partition("@")[2])
    return hosts
