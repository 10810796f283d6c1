"""A batch started by the CLI on a server that predates the RolloutPolicy search attribute
(an embedded server's database outlives upgrades): the CLI registers it and starts the batch."""

from __future__ import annotations

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from temporal_rollouts.client.batches import start_batch
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.records import BatchInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import temporal_binary
from tests.support.servers.process import free_port

pytestmark = pytest.mark.slow


async def test_a_batch_on_an_older_server_registers_the_policy_attribute(tmp_path) -> None:
    older = [key for key in sa.ALL if key is not sa.POLICY]
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        dev_server_existing_path=temporal_binary(),
        search_attributes=older,
        data_converter=pydantic_data_converter,
    )
    try:
        settings = Settings(data_dir=tmp_path, temporal={"address": env.client.service_client.config.target_host})
        handle = await start_batch(
            env.client, settings, BatchInput(env="echo_chain", policy="demo"), "old-server-batch"
        )
        described = await handle.describe()
        assert described.typed_search_attributes.get(sa.POLICY) == "demo"
        assert described.typed_search_attributes.get(sa.ENV) == "echo_chain"
        await handle.terminate("no worker in this test")
    finally:
        await env.shutdown()
