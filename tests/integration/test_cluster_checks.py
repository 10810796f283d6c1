"""Start-up checks for workers on several hosts, against the real dev server: a second host with the
local backend is refused, a remote backend is not, and local storage on a shared Temporal is warned about."""

from __future__ import annotations

import asyncio
import logging
import uuid

import pytest
from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.cluster_checks import (
    check_local_backend_is_alone,
    other_hosts_polling,
    warn_about_local_storage,
)


@activity.defn(name="noop")
async def noop() -> None:
    return None


def host_settings(task_queue: str, host: str, backend: dict | None = None) -> Settings:
    sandbox = {"backend": backend} if backend else {}
    return Settings(temporal={"address": "x:1", "task_queue": task_queue}, worker={"host_name": host}, sandbox=sandbox)


async def test_a_second_host_with_the_local_backend_is_refused(temporal_env) -> None:
    queue = f"hosts-{uuid.uuid4().hex[:8]}"
    client = await Client.connect(temporal_env.client.service_client.config.target_host, identity="4242@host-a")
    async with Worker(client, task_queue=queue, activities=[noop]):
        await asyncio.sleep(1.0)  # let its pollers reach the server
        assert await other_hosts_polling(client, host_settings(queue, "host-b")) == {"host-a"}
        await check_local_backend_is_alone(client, host_settings(queue, "host-a"))  # the same host again: fine
        with pytest.raises(ConfigError, match=r"workers on \['host-a'\] already poll task queue"):
            await check_local_backend_is_alone(client, host_settings(queue, "host-b"))
        static = {"type": "static", "servers": [{"container_id": "s0", "url": "http://10.0.0.5:8080"}]}
        await check_local_backend_is_alone(client, host_settings(queue, "host-b", static))


def test_local_storage_on_a_shared_temporal_is_warned_about(caplog) -> None:
    caplog.set_level(logging.WARNING)
    assert warn_about_local_storage(Settings(temporal={"address": "temporal.internal:7233"}))
    assert "cannot be read by workers on other hosts" in caplog.text
    assert not warn_about_local_storage(Settings())  # the embedded default
    assert not warn_about_local_storage(Settings(temporal={"address": "t:7233"}, storage={"type": "s3"}))
