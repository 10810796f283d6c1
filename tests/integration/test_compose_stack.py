"""The compose stack without Docker: the services of docker-compose.yml started as local
processes with the environment the compose file sets for them, and a batch run through them.

What stands in for each service: a bare Temporal dev server (no search attributes, the compose
dynamic config as flags) for `temporal`; the compose job's own script registers the search
attributes on it; the moto server (path-style S3) for MinIO, its bucket made with boto since
`mc` is not here; the sandbox image's entrypoint script (deriving each token from the pool
secret) for the sandbox services, on their own loopback addresses; the demo policy with the
compose command; two `python worker.py` processes. Compose host names (`temporal:7233`,
`sandbox-0:8080`, ...) are rewritten to the local addresses; nothing else is changed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from temporalio.client import WorkflowFailureError

from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.services import wait_for_port
from temporal_rollouts.runtime.temporal import connect, dynamic_config_flags, temporal_binary
from tests.support import REPO
from tests.support.compose import load_compose
from tests.support.processes import stop_process
from tests.support.sandbox import executions_under
from tests.support.servers.process import HOST, free_port
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

COMPOSE = load_compose()
SERVICES = COMPOSE["services"]
SANDBOXES = sorted(name for name, s in SERVICES.items() if "SANDBOX_CONTAINER_ID" in s.get("environment", {}))


def compose_env(service: str, addresses: dict[str, str]) -> dict[str, str]:
    """The service's compose environment, defaults of `${VAR:-default}` taken, host names made local."""
    env = {}
    for name, value in SERVICES[service]["environment"].items():
        value = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", str(value))
        for compose_address, local in addresses.items():
            value = value.replace(compose_address, local)
        env[name] = value
    return env


def local_argv(argv: list[str], host: str, port: int, root: Path | None = None) -> list[str]:
    """A compose command with its listen address (and data folder) made local."""
    out = list(argv)
    for flag, value in (("--host", host), ("--port", str(port)), ("--root", str(root))):
        if flag in out:
            out[out.index(flag) + 1] = value
    return [sys.executable if part == "python" else part for part in out]


class Stack:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp = tmp_path
        self.procs: list[subprocess.Popen] = []
        self.addresses: dict[str, str] = {}

    def launch(self, name: str, argv: list[str], env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
        log_path = self.tmp / f"{name}.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc, log_path

    def log_tails(self) -> str:
        return "\n".join(f"--- {log.name}\n{log.read_text()[-2000:]}" for log in sorted(self.tmp.glob("*.log")))

    def stop(self) -> None:
        for proc in reversed(self.procs):
            stop_process(proc)


def base_env() -> dict[str, str]:
    keep = ("PATH", "HOME", "LANG", "TMPDIR")
    return {name: os.environ[name] for name in keep if name in os.environ} | {"PYTHONPATH": str(REPO)}


def start_temporal(stack: Stack) -> None:
    """A dev server with the compose dynamic config and no search attributes: the job registers them."""
    port = free_port()
    config = yaml.safe_load((REPO / SERVICES["temporal"]["volumes"][0].split(":")[0]).read_text())
    flags = dynamic_config_flags({key: values[0]["value"] for key, values in config.items()})
    argv = [
        temporal_binary(),
        "server",
        "start-dev",
        "--ip",
        HOST,
        "--port",
        str(port),
        "--headless",
        "--db-filename",
        str(stack.tmp / "temporal.db"),
        "--log-level",
        "warn",
        *flags,
    ]
    proc, log = stack.launch("temporal", argv, base_env())
    wait_for_port(HOST, port, proc, "temporal dev server", log, wait_s=60)
    stack.addresses["temporal:7233"] = f"{HOST}:{port}"


def register_search_attributes(stack: Stack, wait_s: int = 60) -> subprocess.CompletedProcess:
    """The compose job: its entrypoint and environment, with the `temporal` CLI on PATH."""
    service = SERVICES["search-attributes"]
    script = REPO / service["volumes"][0].split(":")[0]
    env = base_env() | compose_env("search-attributes", stack.addresses) | {"WAIT_S": str(wait_s)}
    env["PATH"] = f"{Path(temporal_binary()).parent}:{env.get('PATH', '')}"
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=wait_s + 60)


def start_s3(stack: Stack) -> None:
    moto = shutil.which("moto_server") or str(Path(sys.executable).parent / "moto_server")
    if not Path(moto).exists():
        pytest.skip("moto_server is not installed")
    port = free_port()
    proc, log = stack.launch("moto", [moto, "-H", HOST, "-p", str(port)], base_env())
    wait_for_port(HOST, port, proc, "moto_server", log)
    stack.addresses["http://minio:9000"] = f"http://{HOST}:{port}"


def create_bucket(stack: Stack) -> None:
    import boto3
    from botocore.config import Config

    env = compose_env("bucket", stack.addresses)
    s3 = boto3.client(
        "s3",
        endpoint_url=env["S3_ENDPOINT"],
        region_name="us-east-1",
        aws_access_key_id=env["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=env["AWS_SECRET_ACCESS_KEY"],
        config=Config(s3={"addressing_style": "path"}),
    )
    s3.create_bucket(Bucket=env["S3_BUCKET"])


def start_sandboxes(stack: Stack) -> None:
    for index, name in enumerate(SANDBOXES):
        host = f"127.0.0.{index + 2}"
        port = free_port(host)
        service = SERVICES[name]
        root = stack.tmp / name
        root.mkdir()
        env = base_env() | compose_env(name, stack.addresses) | {"PYTHON": sys.executable}
        argv = ["sh", str(REPO / "docker" / "sandbox-entrypoint.sh"), *local_argv(service["command"], host, port, root)]
        proc, log = stack.launch(name, argv, env)
        wait_for_port(host, port, proc, name, log)
        assert "ROLLOUTS_SANDBOX_SECRET" not in Path(f"/proc/{proc.pid}/environ").read_bytes().decode(errors="replace")
        stack.addresses[f"{name}:8080"] = f"{host}:{port}"


def start_policy(stack: Stack) -> None:
    port = free_port()
    proc, log = stack.launch("policy", local_argv(SERVICES["policy"]["command"], HOST, port), base_env())
    wait_for_port(HOST, port, proc, "demo policy", log)
    stack.addresses["policy:8765"] = f"{HOST}:{port}"


def worker_env(stack: Stack, index: int) -> dict[str, str]:
    env = base_env() | compose_env("worker", stack.addresses)
    # Every replica mounts the one named volume at the data dir: a batch's results file is named
    # by the process that starts it and written by whichever worker runs the sink.
    volume, _, mounted = SERVICES["worker"]["volumes"][0].partition(":")
    assert mounted == env["ROLLOUTS_DATA_DIR"] and volume in COMPOSE["volumes"]
    env["ROLLOUTS_DATA_DIR"] = str(stack.tmp / volume)
    env["ROLLOUTS_WORKER__HOST_NAME"] = f"worker-{index}"  # compose gives each replica its own hostname
    unresolved = [
        (name, value)
        for name, value in env.items()
        for service in SERVICES
        if re.search(rf"(^|//|\"){re.escape(service)}:\d", value)
    ]
    assert not unresolved, f"the worker names a compose service this test does not run: {unresolved}"
    return env


def start_workers(stack: Stack, count: int) -> None:
    started = [stack.launch(f"worker-{i}", [sys.executable, "worker.py"], worker_env(stack, i)) for i in range(count)]
    deadline = time.monotonic() + 90
    for proc, log in started:
        while "worker polling task queue" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)


@pytest.fixture
def stack(tmp_path) -> Iterator[Stack]:
    made = Stack(tmp_path)
    try:
        yield made
    finally:
        made.stop()


def test_the_registration_job_fails_loudly_without_temporal(tmp_path) -> None:
    stack = Stack(tmp_path)
    stack.addresses["temporal:7233"] = f"{HOST}:{free_port()}"  # nothing listens there
    done = register_search_attributes(stack, wait_s=4)
    assert done.returncode == 1
    assert "not ready after 4s" in done.stderr


async def test_a_batch_runs_through_the_compose_services(stack, monkeypatch) -> None:
    start_temporal(stack)
    start_s3(stack)
    registered = register_search_attributes(stack)
    assert registered.returncode == 0, registered.stdout + registered.stderr
    wanted = SERVICES["search-attributes"]["environment"]["ROLLOUT_SEARCH_ATTRIBUTES"].split()
    assert registered.stdout.count(": created ") == len(wanted) == len(search_attributes.ALL)
    again = register_search_attributes(stack)  # a restarted job finds them all and exits 0
    assert again.returncode == 0 and ": created " not in again.stdout, again.stdout + again.stderr
    create_bucket(stack)
    start_sandboxes(stack)
    start_policy(stack)
    start_workers(stack, 2)

    for name, value in worker_env(stack, 0).items():  # this process as a third container of the worker service
        if name.startswith(("ROLLOUTS_", "AWS_")):
            monkeypatch.setenv(name, value)
    settings = Settings()
    client = await connect(settings, start_embedded=False)
    batch = BatchInput(env="echo_chain", num_items=4, group_size=2, max_concurrency=8, env_config={"steps": 2})
    handle = await client.start_workflow(
        BatchWorkflow.run, batch, id=f"compose-{uuid.uuid4().hex[:6]}", task_queue=settings.temporal.task_queue
    )
    try:
        result = BatchResult.model_validate(await asyncio.wait_for(handle.result(), 240))
    except WorkflowFailureError as err:
        raise AssertionError(f"the batch failed: {failure_chain(err)}\n{stack.log_tails()}") from err
    assert (result.total, result.completed, result.failed, result.mean_score) == (8, 8, 0, 1.0)
    assert result.output and Path(result.output).is_relative_to(stack.tmp / "worker-data")
    assert len(Path(result.output).read_text().splitlines()) == 4  # one scored group per item
    rollout = await client.get_workflow_handle(f"{handle.id}/item-0/g0").describe()
    assert rollout.typed_search_attributes.get(search_attributes.ENV) == "echo_chain"
    for name in SANDBOXES:
        address = stack.addresses[f"{name}:8080"]
        assert httpx.get(f"http://{address}/health", timeout=5).is_success
        assert executions_under(stack.tmp / name, ""), f"{name} ran no tool call"


def failure_chain(err: BaseException | None) -> str:
    causes = []
    while err is not None:
        causes.append(f"{type(err).__name__}: {err}")
        err = err.__cause__
    return " <- ".join(causes)
