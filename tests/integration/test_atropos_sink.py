"""Batches that post their groups straight to the real Atropos `run-api`, pulled back the
way a trainer pulls them. The policy here is the demo policy (chat), so sequences carry
no tokens: token ids, masks and logprobs through run-api are in test_atropos_env.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from activities.sinks import SinkActivities, WriteGroupInput
from temporal_rollouts.core.records import BatchInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from temporal_rollouts.sinks.groups import GroupBuilder
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support.servers.run_api import RunApiProcess, pull_batch, register_trainer
from tests.support.waiting import batch_id
from temporal_rollouts.runtime.worker import Parts
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow


@pytest.fixture
def atropos_settings(settings: Settings, run_api: RunApiProcess) -> Iterator[Settings]:
    before = settings.atropos.api_url
    settings.atropos.api_url = run_api.url  # the worker's settings object: its sink reads this per write
    yield settings
    settings.atropos.api_url = before


async def test_batch_groups_reach_a_trainer_through_run_api(
    client: Client, atropos_settings: Settings, run_api: RunApiProcess, tmp_path: Path
) -> None:
    async with TrajectoryApi(run_api.url) as api:
        await register_trainer(api, batch_size=4, max_token_len=4096, checkpoint_dir=tmp_path)
        result = await client.execute_workflow(
            BatchWorkflow.run,
            BatchInput(env="terminal_tasks", num_items=2, group_size=2, sink="atropos"),
            id=batch_id("atropos"),
            task_queue=atropos_settings.temporal.task_queue,
        )
        assert (result.completed, result.groups_written) == (4, 2)
        batch = await pull_batch(api, timeout_s=30)

    local = {tuple(g["overrides"][0].values()): g for g in read_groups(Path(result.output))}
    assert len(batch) == 2
    for group in batch:
        assert group["scores"] == [1.0, 1.0], [m[-1] for m in group["messages"]]
        assert len(group["messages"]) == 2 and all("content" in m for t in group["messages"] for m in t)
        assert group["messages"][0][1]["role"] == "user"
        same = local[tuple(group["overrides"][0].values())]
        assert group["messages"] == same["messages"], "the trainer gets what the JSONL holds"
        assert "metadata" not in group, "run-api takes ScoredDataGroup fields only"
        overrides = group["group_overrides"]
        assert (overrides["tool_errors"], overrides["tool_errors_by_tool"]) == (0, {})
        calls = overrides["tool_stats"]
        assert calls["attempted"] == calls["schema_valid"] == calls["executed_ok"] >= 2
        assert calls["execution_errors"] == 0 and calls == same["metadata"]["tool_stats"]["total"]


async def test_a_retried_write_posts_a_group_once(
    parts: Parts, atropos_settings: Settings, run_api: RunApiProcess, client: Client, tmp_path: Path
) -> None:
    result = await client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=2),
        id=batch_id("once"),
        task_queue=atropos_settings.temporal.task_queue,
    )
    first = read_groups(Path(result.output))[0]
    results = []
    for rollout_id in first["metadata"]["rollout_ids"]:
        results.append(await client.get_workflow_handle(rollout_id).result())
    sinks = SinkActivities(atropos_settings, GroupBuilder(parts.transcripts, parts.traces))
    # Inside the results folder (sinks write nowhere else), in a folder open_sink never made here: on a
    # cluster the worker that opened the sink may be another host.
    groups_file = atropos_settings.results_dir / "opened-elsewhere" / f"{batch_id('once-file')}.jsonl"
    write = WriteGroupInput(path=str(groups_file), group_id="g-once", results=results, sink="atropos")
    async with TrajectoryApi(run_api.url) as api:
        await register_trainer(
            api, batch_size=4, max_token_len=4096, checkpoint_dir=tmp_path
        )  # run-api queues for a trainer
        queued = (await api.status())["queue_size"]
        assert (await sinks.write_group(write)).status == "written"
        assert (await sinks.write_group(write)).status == "already_written"
        assert (await api.status())["queue_size"] == queued + 1
    assert len(read_groups(groups_file)) == 1


async def test_an_env_id_run_api_lost_is_told_and_the_registration_after_it_goes_through(tmp_path: Path) -> None:
    """run-api answers an env id it does not know (it restarted) with an exception that makes uvicorn drop
    the connection unannounced: the registration that follows on the same client must not read from it."""
    server = RunApiProcess(tmp_path / "run_api.log")
    server.start()
    try:
        async with TrajectoryApi(server.url) as api:
            await register_trainer(api, batch_size=4, max_token_len=4096, checkpoint_dir=tmp_path)
            assert await api.batch() is None  # the trainer's first ask opens env registration
            for attempt in range(3):
                assert await api.env_status(10 + attempt) is None
                registered = await api.register_env(f"probe-{attempt}", 1024, 2)
                assert registered["status"] == "success", registered
                assert (await api.env_status(registered["env_id"]))["self_queue_size"] == 0
    finally:
        server.stop()
