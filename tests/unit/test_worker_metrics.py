"""`worker.metrics_address`: the SDK's metrics (the sticky cache's misses and evictions among them)
served for Prometheus, one port per worker process, and a clear error for an address in use."""

from __future__ import annotations

import httpx
import pytest

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import metrics_runtime
from temporal_rollouts.runtime.worker_processes import WorkerProcesses
from tests.support.servers.process import free_port


def test_no_address_no_runtime_of_its_own():
    assert metrics_runtime(Settings()) is None


def test_the_runtime_serves_prometheus_metrics_and_an_address_in_use_is_a_config_error():
    address = f"127.0.0.1:{free_port()}"
    runtime = metrics_runtime(Settings(worker={"metrics_address": address}))
    assert runtime is not None
    answer = httpx.get(f"http://{address}/metrics", timeout=10)
    assert answer.status_code == 200
    with pytest.raises(ConfigError, match="worker.metrics_address"):
        metrics_runtime(Settings(worker={"metrics_address": address}))


@pytest.mark.parametrize("address", ["9464", "127.0.0.1", "host:port", " :9464"])
def test_an_address_without_host_and_port_is_refused(address):
    with pytest.raises(ConfigError, match="worker.metrics_address"):
        Settings(worker={"metrics_address": address})


def test_each_extra_worker_process_serves_on_the_next_port(monkeypatch):
    monkeypatch.delenv("ROLLOUTS_WORKER__METRICS_ADDRESS", raising=False)
    settings = Settings(worker={"metrics_address": "0.0.0.0:9464", "processes": 3})
    processes = WorkerProcesses(settings, 2, ["worker.py"])
    # process 1 is `python worker.py` itself on 9464; the two it starts take the next ports
    assert [processes._env(i)["ROLLOUTS_WORKER__METRICS_ADDRESS"] for i in range(2)] == [
        "0.0.0.0:9465",
        "0.0.0.0:9466",
    ]
    assert "ROLLOUTS_WORKER__METRICS_ADDRESS" not in WorkerProcesses(Settings(), 1, ["worker.py"])._env(0)
