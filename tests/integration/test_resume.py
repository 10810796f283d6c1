"""Failed rollouts resume where they stopped, with their workspace; histories stay small."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections import Counter
from datetime import datetime
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError

from envs.terminal_tasks.env import TerminalTasksEnv
from temporal_rollouts.client.batches import start_batch
from temporal_rollouts.client.records import list_batches
from temporal_rollouts.cli.resume import cmd_resume
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.records import (
    BatchInput,
    BatchResult,
    RolloutLimits,
    StopReason,
    TrajectoryInput,
    TrajectoryResult,
)
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support import REPO
from tests.support.processes import settings_environment
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import leased_slots, wait_until
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.slow


async def rollouts_cli(settings: Settings, *args: str) -> dict:
    """The `rollouts` command as a user runs it, configured through the environment (in a
    thread: this test process also runs the worker)."""
    return await asyncio.to_thread(_run_cli, settings, *args)


def _run_cli(settings: Settings, *args: str) -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "temporal_rollouts.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **settings_environment(settings)},
    )
    assert done.returncode in (0, 2), done.stderr
    return json.loads(done.stdout)


async def failed_result(client: Client, workflow_id: str) -> TrajectoryResult:
    with pytest.raises(WorkflowFailureError) as caught:
        await client.get_workflow_handle(workflow_id).result()
    return TrajectoryResult.model_validate(caught.value.cause.details[0])


async def test_resume_after_a_model_outage_keeps_turns_and_files(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess, pool: SandboxPool
) -> None:
    demo_policy.control(delay_s=1.0)
    rollout = f"outage-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="echo_chain", item=Item(id="echo-77"), env_config={"steps": 8}),
        id=rollout,
        task_queue=settings.temporal.task_queue,
    )

    async def two_turns_done() -> bool:
        return (await handle.query("progress"))["turns"] >= 2

    await wait_until(two_turns_done, timeout_s=60, interval_s=0.05)
    demo_policy.control(delay_s=0, fail_next=10_000, fail_status=503, retry_after=0.05)  # the model server goes down
    failed = await failed_result(client, rollout)
    assert failed.stop_reason is StopReason.MODEL_UNAVAILABLE and failed.snapshot
    done_before = failed.turns
    assert done_before >= 2 and await leased_slots(pool) == []

    demo_policy.reset()  # the model server is back
    resumed = await rollouts_cli(settings, "resume", rollout, "--json")
    assert resumed["resumed_from_run"] == handle.result_run_id
    result = TrajectoryResult.model_validate(await client.get_workflow_handle(rollout).result())

    assert result.score == 1.0, "chain.log holds every step once: the files survived and no command ran twice"
    assert result.turns == 9 and result.resumed_from_run == handle.result_run_id
    turns = Counter(next(iter(demo_policy.stats()["conversations"].values())))
    assert all(turns[t] == 0 for t in range(done_before)), f"finished turns were sent again: {turns}"
    described = await client.get_workflow_handle(rollout).describe()
    assert described.typed_search_attributes.get(sa.RESUMED_FROM) == handle.result_run_id
    assert await leased_slots(pool) == []


async def test_resume_after_a_verifier_fix_runs_the_fixed_verifier(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixed_verify = TerminalTasksEnv.verify

    async def buggy_verify(self, item, slot, transcript):
        raise TypeError("verifier bug")

    monkeypatch.setattr(TerminalTasksEnv, "verify", buggy_verify)
    rollout = f"verifier-{uuid.uuid4().hex[:6]}"
    await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="terminal_tasks", item=Item(id="csv-to-json")),
        id=rollout,
        task_queue=settings.temporal.task_queue,
    )
    failed = await failed_result(client, rollout)
    assert failed.stop_reason is StopReason.ENV_ERROR and "verifier bug" in failed.stop_detail
    requests_before = demo_policy.stats()["total"]

    monkeypatch.setattr(TerminalTasksEnv, "verify", fixed_verify)  # the fix is deployed
    await rollouts_cli(settings, "resume", rollout, "--json")
    result = TrajectoryResult.model_validate(await client.get_workflow_handle(rollout).result())

    assert result.score == 1.0 and result.stop_reason is StopReason.COMPLETED
    assert result.turns == failed.turns
    assert demo_policy.stats()["total"] == requests_before, "resuming a verification sent no model turn"


async def test_resume_a_batch_completes_its_pending_groups(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(fail_next=10_000, fail_status=503, retry_after=0.01)
    batch_id = f"resume-batch-{uuid.uuid4().hex[:6]}"
    first = BatchResult.model_validate(
        await client.execute_workflow(
            BatchWorkflow.run,
            BatchInput(env="echo_chain", num_items=2, group_size=2, env_config={"steps": 2}),
            id=batch_id,
            task_queue=settings.temporal.task_queue,
        )
    )
    assert (first.failed, first.groups_written, first.groups_pending) == (4, 0, 2)

    demo_policy.reset()
    summary = await rollouts_cli(settings, "resume", batch_id, "--wait", "--json")

    assert len(summary["resumed"]) == 4
    assert (summary["completed"], summary["failed"], summary["groups_written"]) == (4, 0, 2)
    assert summary["mean_score"] == 1.0


async def test_a_resumed_batch_keeps_its_labels(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess
) -> None:
    """After `rollouts resume`, `list`, `status` and the summary still name the batch's policy, and
    `list` says when the batch first started, not when it was resumed."""
    demo_policy.control(fail_next=10_000, fail_status=503, retry_after=0.01)
    handle = await start_batch(
        client,
        settings,
        BatchInput(env="echo_chain", num_items=1, group_size=1, policy="demo"),
        f"resume-labels-{uuid.uuid4().hex[:6]}",
    )
    assert BatchResult.model_validate(await handle.result()).failed == 1
    first_started = (await handle.describe()).start_time

    demo_policy.reset()
    summary = await rollouts_cli(settings, "resume", handle.id, "--wait", "--json")
    assert summary["policy"] == "demo" and summary["completed"] == 1
    [listed] = [b for b in await rollouts_cli(settings, "list", "--json") if b["batch_id"] == handle.id]
    assert listed["policy"] == "demo"
    assert datetime.fromisoformat(listed["started_at"]) == first_started
    assert (await rollouts_cli(settings, "status", handle.id, "--json"))["policy"] == "demo"
    # its rollout failed, then was resumed to a score: listed as it is now, not as its first run was
    assert await rollouts_cli(settings, "list", handle.id, "--status", "failed", "--json") == []
    [row] = await rollouts_cli(settings, "list", handle.id, "--json")
    assert (row["status"], row["score"]) == ("completed", 1.0)


async def test_resume_of_an_unknown_id_says_so_as_other_commands_do(settings: Settings, client: Client) -> None:
    with pytest.raises(ConfigError, match=r"^no batch or rollout with id 'nope' \(see `rollouts list`\)$"):
        await cmd_resume(argparse.Namespace(id="nope", wait=False, json=True), settings)


async def test_a_hundred_turn_rollout_keeps_its_history_small(client: Client, settings: Settings) -> None:
    """Tool outputs of ~2,000 tokens (8,000 characters) for 100 turns: the context grows to
    ~800 KB, the history must not."""
    result = await client.execute_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(
            env="echo_chain",
            item=Item(id="echo-100"),
            env_config={"steps": 100, "output_chars": 8000},
            limits=RolloutLimits(max_turns=101, max_tool_calls=200, context_tokens=10**7),
        ),
        id=f"long-{uuid.uuid4().hex[:6]}",
        task_queue=settings.temporal.task_queue,
    )
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    size = sum(event.ByteSize() for event in history.events)
    assert result.score == 1.0 and result.turns == 101 and result.transcript.tokens > 200_000
    assert len(history.events) < 5000 and size < 500_000, (len(history.events), size)


async def test_a_long_batch_continues_as_new_and_loses_nothing(settings: Settings, parts, demo_policy) -> None:
    """On a server that suggests continue-as-new after 60 events, a 12-rollout batch spans
    several runs; every rollout is counted once and every group written once."""
    from tests.support.fixtures import continue_as_new_server

    batch_id = f"long-batch-{uuid.uuid4().hex[:6]}"
    async with continue_as_new_server(settings, parts, after_events=60) as (client, own):
        result = BatchResult.model_validate(
            await client.execute_workflow(
                BatchWorkflow.run,
                BatchInput(env="echo_chain", num_items=12, group_size=1, max_concurrency=2, env_config={"steps": 1}),
                id=batch_id,
                task_queue=own.temporal.task_queue,
            )
        )
        runs = [w async for w in client.list_workflows(f"WorkflowId = '{batch_id}'")]
        [listed] = [b for b in await list_batches(client, 10) if b.batch_id == batch_id]
    assert len(runs) > 1, "the batch continued as new"
    assert listed.started_at == min(run.start_time for run in runs), "listed as started when its first run did"
    assert (result.total, result.completed, result.groups_written) == (12, 12, 12)
    assert len(read_groups(Path(result.output))) == 12
