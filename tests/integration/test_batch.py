"""Batches end to end on the real dev server, sandbox process and demo policy process."""

from __future__ import annotations

import io
import json
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console
from temporalio.client import Client, WorkflowFailureError

from envs.echo_chain.env import EchoChainEnv
from temporal_rollouts.cli.progress import print_summary
from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import temporal_binary
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import batch_id, leased_slots
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow


async def run_batch(client: Client, settings: Settings, batch: BatchInput) -> BatchResult:
    return await client.execute_workflow(
        BatchWorkflow.run, batch, id=batch_id(), task_queue=settings.temporal.task_queue
    )


async def test_batch_scores_every_rollout_and_writes_groups(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess
) -> None:
    result = await run_batch(client, settings, BatchInput(env="terminal_tasks", num_items=4, group_size=2))

    assert (result.total, result.completed, result.failed) == (8, 8, 0)
    assert result.mean_score == 1.0
    assert result.stop_reasons == {"completed": 8}
    groups = read_groups(Path(result.output))
    assert len(groups) == 4 == result.groups_written
    assert len({g["metadata"]["item_id"] for g in groups}) == 4
    for group in groups:
        assert group["scores"] == [1.0, 1.0]
        assert len(group["messages"]) == 2
        transcript = group["messages"][0]
        assert transcript[0]["role"] == "system" and transcript[1]["role"] == "user"
        assert any(m["role"] == "tool" for m in transcript)
        assert group["metadata"]["tool_errors"]["count"] == 0
    assert await leased_slots(pool) == []
    # Both rollouts of a group share a prompt: each turn was asked for exactly twice, never more.
    conversations = demo_policy.stats()["conversations"]
    assert len(conversations) == 4
    for turns in conversations.values():
        assert set(Counter(turns).values()) == {2}, turns


async def test_batch_started_with_the_temporal_cli(client: Client, settings: Settings) -> None:
    workflow_id = batch_id("cli")
    subprocess.run(
        [
            temporal_binary(),
            "workflow",
            "start",
            "--address",
            settings.temporal_address,
            "--type",
            "BatchWorkflow",
            "--task-queue",
            settings.temporal.task_queue,
            "--workflow-id",
            workflow_id,
            "--input",
            json.dumps({"env": "terminal_tasks", "num_items": 2, "group_size": 1}),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    raw = await client.get_workflow_handle(workflow_id).result()
    result = BatchResult.model_validate(raw)
    assert (result.total, result.completed, result.mean_score) == (2, 2, 1.0)


async def test_unknown_env_fails_the_batch_with_the_known_names(client: Client, settings: Settings) -> None:
    with pytest.raises(WorkflowFailureError) as caught:
        await run_batch(client, settings, BatchInput(env="no_such_env", num_items=1, group_size=1))
    message = str(caught.value.cause)  # the batch's own error, not a wrapped activity failure
    assert "no_such_env" in message and "terminal_tasks" in message


async def test_items_past_the_task_set_are_refused_unless_the_batch_cycles(
    client: Client, settings: Settings, monkeypatch
) -> None:
    """An env of three items (echo_chain made finite; the worker runs in this process). Five items
    are refused, naming cycle_items; with it the batch runs them and says only three were distinct."""
    monkeypatch.setattr(EchoChainEnv, "item_count", lambda self: 3)
    with pytest.raises(WorkflowFailureError) as caught:
        await run_batch(client, settings, BatchInput(env="echo_chain", num_items=5, group_size=1))
    assert "num_items: 5 items from offset 0 run past the end of env 'echo_chain', which has 3 items" in str(
        caught.value.cause
    )
    assert "cycle_items" in str(caught.value.cause)

    result = await run_batch(
        client, settings, BatchInput(env="echo_chain", num_items=5, group_size=1, cycle_items=True)
    )
    assert (result.completed, result.items, result.distinct_items) == (5, 5, 3)
    screen = io.StringIO()
    print_summary(result, Console(file=screen, width=120), settings)
    assert "5 (3 distinct)" in screen.getvalue()


async def test_start_rate_spreads_the_rollouts_starts(client: Client, settings: Settings) -> None:
    from temporal_rollouts.core import search_attributes as sa

    workflow_id = batch_id("paced")
    batch = BatchInput(
        env="echo_chain", num_items=6, group_size=1, max_concurrency=6, start_rate=2, env_config={"steps": 1}
    )
    result = await client.execute_workflow(
        BatchWorkflow.run, batch, id=workflow_id, task_queue=settings.temporal.task_queue
    )

    assert (result.completed, result.failed) == (6, 0)
    children = [
        wf
        async for wf in client.list_workflows(f'{sa.BATCH_ID.name}="{workflow_id}" AND WorkflowId != "{workflow_id}"')
    ]
    starts = sorted(wf.start_time for wf in children)
    assert len(starts) == 6
    # Two a second: three windows, so the last start comes at least two seconds after the first
    # (unpaced, all six start from one workflow task).
    assert (starts[-1] - starts[0]).total_seconds() >= 1.9, starts
