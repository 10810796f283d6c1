"""`rollouts resume`: continue a failed rollout, or every failed rollout of a batch, where it stopped.

Split from cli.py. A resumed rollout is a new run of the same workflow id started with
the old run's input plus `resume_from_run`; a resumed batch gathers its groups again.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from pydantic import BaseModel
from rich.console import Console
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowHandle,
)
from temporalio.common import (
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)

from temporal_rollouts.cli.progress import finish
from temporal_rollouts.cli.records import (
    FIRST_STARTED,
    describe_or_none,
    first_started_at,
)
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.records import BatchInput, TrajectoryInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.cli.connection import command_client

CLOSED_UNSUCCESSFULLY = ("Failed", "Terminated", "TimedOut", "Canceled")


async def started_input(client: Client, handle: WorkflowHandle, model: type[BaseModel]) -> BaseModel:
    """The input a run was started with, read from its history."""
    history = await handle.fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [value] = await client.data_converter.decode(payloads, [model])
    return value


async def _failed_rollouts(client: Client, batch_id: str) -> list[str]:
    """Rollouts of a batch whose latest run failed, timed out, was terminated or cancelled."""
    statuses = " OR ".join(f"ExecutionStatus = '{status}'" for status in CLOSED_UNSUCCESSFULLY)
    query = f"RolloutBatchId = '{batch_id}' AND WorkflowType = 'TrajectoryWorkflow' AND ({statuses})"
    candidates = sorted({execution.id async for execution in client.list_workflows(query)})
    failed = []
    for rollout in candidates:
        described = await client.get_workflow_handle(rollout).describe()
        if (
            described.status != WorkflowExecutionStatus.RUNNING
            and described.status != WorkflowExecutionStatus.COMPLETED
        ):
            failed.append(rollout)
    return failed


async def resume_rollout(client: Client, settings: Settings, rollout: str) -> dict[str, Any]:
    """A new run of the rollout that continues where its latest run stopped."""
    from workflows.trajectory import TrajectoryWorkflow

    handle = client.get_workflow_handle(rollout)
    described = await handle.describe()
    original = await started_input(
        client, client.get_workflow_handle(rollout, run_id=described.run_id), TrajectoryInput
    )
    resumed = original.model_copy(update={"resume_from_run": described.run_id})
    new = await client.start_workflow(
        TrajectoryWorkflow.run,
        resumed,
        id=rollout,
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        memo={"resumed_from_run": described.run_id},
        search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(sa.ENV, original.env),
                SearchAttributePair(sa.ITEM_ID, original.item.id),
                *([SearchAttributePair(sa.BATCH_ID, original.batch_id)] if original.batch_id else []),
            ]
        ),
    )
    return {"rollout_id": rollout, "resumed_from_run": described.run_id, "run_id": new.result_run_id}


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume a failed rollout, or every failed rollout of a batch and gather its groups again."""
    console = Console(stderr=args.json)
    client = await command_client(settings)
    described = await describe_or_none(client, args.id)
    if described is None:
        raise ConfigError(f"no batch or rollout with id {args.id!r} (see `rollouts list`)")
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise ConfigError(f"{args.id} is still running; resume it once it has stopped")
    if described.workflow_type == "TrajectoryWorkflow":
        resumed = await resume_rollout(client, settings, args.id)
        if args.json:
            print(json.dumps(resumed))
        else:
            console.print(
                f"resumed {resumed['rollout_id']} from run {resumed['resumed_from_run']} as run {resumed['run_id']}"
            )
        return 0
    if described.workflow_type != "BatchWorkflow":
        raise ConfigError(f"{args.id} is a {described.workflow_type}, not a batch or a rollout")
    failed = await _failed_rollouts(client, args.id)
    original = await started_input(client, client.get_workflow_handle(args.id, run_id=described.run_id), BatchInput)
    new = await resume_batch(client, settings, described, original)
    if not args.json:
        console.print(f"resuming {len(failed)} rollout(s) of {args.id}: " + (", ".join(failed) or "none"))
        console.print(f"the batch gathers its groups again as run {new.result_run_id}")
    if not args.wait:
        if args.json:
            print(json.dumps({"batch_id": args.id, "run_id": new.result_run_id, "resumed": failed}))
        return 0
    return await finish(
        client, new, console, settings, as_json=args.json, extra={"resumed": failed}, policy=original.policy
    )


async def resume_batch(
    client: Client, settings: Settings, described: WorkflowExecutionDescription, original: BatchInput
) -> WorkflowHandle:
    """A new run of the batch that gathers it again; it keeps the labels of the run it resumes (env,
    policy) and the time the batch first started."""
    from workflows.batch import BatchWorkflow

    attributes = [SearchAttributePair(sa.ENV, original.env)]
    if policy := described.typed_search_attributes.get(sa.POLICY) or original.policy:
        attributes.append(SearchAttributePair(sa.POLICY, policy))
    first_started = await first_started_at(client, described)
    return await client.start_workflow(
        BatchWorkflow.run,
        original.model_copy(update={"resume": True, "cursor": None}),
        id=described.id,
        task_queue=settings.temporal.task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
        search_attributes=TypedSearchAttributes(attributes),
        memo={
            "resumed_from_run": described.run_id,
            FIRST_STARTED: first_started.isoformat() if first_started else None,
        },
    )
