"""Continue a failed rollout, or every failed rollout of a batch, where it stopped (`rollouts resume`).

A resumed rollout is a new run of the same workflow id started with the old run's input plus
`resume_from_run`; a resumed batch gathers its groups again.
"""

from __future__ import annotations

from typing import Any

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

from activities.resume import run_input
from temporal_rollouts.client.records import FIRST_STARTED, describe_or_none, first_started_at
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.records import BatchInput, TrajectoryInput
from temporal_rollouts.core.settings import Settings

CLOSED_UNSUCCESSFULLY = ("Failed", "Terminated", "TimedOut", "Canceled")


async def resumable(client: Client, workflow_id: str) -> WorkflowExecutionDescription:
    """The description of a batch or rollout that has stopped, or a ConfigError saying why it cannot be resumed."""
    described = await describe_or_none(client, workflow_id)
    if described is None:
        raise ConfigError(f"no batch or rollout with id {workflow_id!r} (see `rollouts list`)")
    if described.status == WorkflowExecutionStatus.RUNNING:
        raise ConfigError(f"{workflow_id} is still running; resume it once it has stopped")
    if described.workflow_type not in ("TrajectoryWorkflow", "BatchWorkflow"):
        raise ConfigError(f"{workflow_id} is a {described.workflow_type}, not a batch or a rollout")
    return described


async def failed_rollouts(client: Client, batch_id: str) -> list[str]:
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
    original = await run_input(client, rollout, described.run_id, TrajectoryInput)
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


async def resume_batch(
    client: Client, settings: Settings, described: WorkflowExecutionDescription
) -> tuple[WorkflowHandle, BatchInput]:
    """A new run of the batch that gathers it again, and the input of the run it resumes; it keeps that run's
    labels (env, policy) and the time the batch first started."""
    from workflows.batch import BatchWorkflow

    original = await run_input(client, described.id, described.run_id, BatchInput)
    attributes = [SearchAttributePair(sa.ENV, original.env)]
    if policy := described.typed_search_attributes.get(sa.POLICY) or original.policy:
        attributes.append(SearchAttributePair(sa.POLICY, policy))
    first_started = await first_started_at(client, described)
    handle = await client.start_workflow(
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
    return handle, original
