"""Batches: the input a command starts one with, starting it, its status and counts, cancelling it.

A batch is a `BatchWorkflow` on the task queue, started with plain JSON input, so everything
here can also be done with the `temporal` CLI or the Temporal UI. Its policy is decided when it
starts (`resolve_policy`), so a batch is labelled with the policy that ran it.
"""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.client.records import (
    QUERY_TIMEOUT,
    batch_outcome,
    id_taken,
    require_workflow,
    root_cause,
    status_name,
    waiting_on_retries,
)
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.inputs import parse_input
from temporal_rollouts.core.records import BatchInput, BatchProgress, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.registration import add_missing_search_attributes

BATCH = "BatchWorkflow"


def resolve_policy(settings: Settings, policy: str | None) -> str:
    """The policy a batch runs on, decided here when it starts: the caller's own `default_policy`
    when none is named, checked against the caller's settings (the worker resolves the name to an
    endpoint, so no URL secret or key enters the workflow)."""
    name = policy or settings.default_policy
    settings.policy_endpoint(name)  # raises ConfigError naming the known policies
    return name


def batch_input(fields: dict[str, Any], settings: Settings, *, env_known: bool = True) -> BatchInput:
    """The batch `fields` ask for, its policy decided (`resolve_policy`), checked with the workflow's own
    checks and words, and its items against the env's task set where this process knows the env (the
    batch's first step checks them on the worker too)."""
    fields = {**fields, "policy": resolve_policy(settings, fields.get("policy"))}
    batch = parse_input(BatchInput, fields, BATCH)
    if env_known:
        check_items(batch)
    return batch


def check_items(batch: BatchInput) -> None:
    """The batch's first step checks this too; here it is refused before anything starts."""
    from activities.envs import check_items_fit
    from envs.registry import get_env

    item_count = get_env(batch.env, batch.env_config).item_count()
    check_items_fit(batch.env, item_count, batch.num_items, batch.item_offset, batch.cycle_items)


async def start_batch(
    client: Client, settings: Settings, batch: BatchInput, batch_id: str | None = None
) -> WorkflowHandle:
    """Start the batch under `batch_id` (generated when None); an id an earlier workflow holds is a ConfigError
    saying what holds it. A server without the project's search attributes gets them first."""
    from workflows.batch import BatchWorkflow

    if batch.branch is not None:  # its rollouts carry RolloutForkedFrom, which an older server may lack
        await add_missing_search_attributes(client, settings.temporal.namespace)
    attributes = [SearchAttributePair(sa.ENV, batch.env)]
    if batch.policy:
        attributes.append(SearchAttributePair(sa.POLICY, batch.policy))
    workflow_id = batch_id or f"batch-{batch.env}-{uuid.uuid4().hex[:8]}"

    async def start() -> WorkflowHandle:
        try:
            return await client.start_workflow(
                BatchWorkflow.run,
                batch,
                id=workflow_id,
                task_queue=settings.temporal.task_queue,
                search_attributes=TypedSearchAttributes(attributes),
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            )
        except WorkflowAlreadyStartedError:
            raise await id_taken(client, workflow_id) from None

    try:
        return await start()
    except RPCError as err:
        if err.status != RPCStatusCode.INVALID_ARGUMENT or "search attribute" not in err.message.lower():
            raise
        if not await add_missing_search_attributes(client, settings.temporal.namespace):
            raise
        return await start()


async def worker_is_polling(client: Client, settings: Settings) -> bool:
    """Whether some worker polls the task queue for workflow tasks (True when the server cannot say)."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    try:
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=settings.temporal.namespace,
                task_queue=TaskQueue(name=settings.temporal.task_queue),
                task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
            )
        )
    except RPCError:
        return True
    return bool(described.pollers)


async def batch_progress(handle: WorkflowHandle) -> BatchProgress | None:
    """A running batch's counts, from its `progress` query (a worker answers it)."""
    raw = await handle.query("progress", rpc_timeout=QUERY_TIMEOUT)
    return BatchProgress.model_validate(raw) if raw else None


def summary_json(result: BatchResult) -> dict[str, Any]:
    """A finished batch as `--json` gives it."""
    return {
        "batch_id": result.batch_id,
        "env": result.env,
        "total": result.total,
        "completed": result.completed,
        "failed": result.failed,
        "mean_score": result.mean_score,
        "stop_reasons": result.stop_reasons,
        "stop_details": result.stop_details,
        "items": result.items,
        "distinct_items": result.distinct_items,
        "output": result.output,
        "groups_written": result.groups_written,
        "groups_pending": result.groups_pending,
        "resumed": result.resumed,
    }


async def batch_status(client: Client, batch_id: str) -> dict[str, Any]:
    """A batch's state, counts, policy and (while it runs) the rollouts waiting on retries and why.
    `status` is the batch's outcome as `rollouts list` and the web page name it (`batch_outcome`:
    a finished batch whose every rollout failed is `failed`, not `completed`); `workflow_status`
    is how its workflow ended."""
    described = await require_workflow(client, batch_id, BATCH)
    handle = client.get_workflow_handle(batch_id)
    status = status_name(described.status)
    data: dict[str, Any] = {
        "batch_id": batch_id,
        "status": status,
        "workflow_status": status,
        "policy": described.typed_search_attributes.get(sa.POLICY),
    }
    if described.status == WorkflowExecutionStatus.COMPLETED:
        result = BatchResult.model_validate(await handle.result())
        data |= summary_json(result)
        return {**data, "status": batch_outcome(status, result.completed, result.failed)}
    try:
        progress = await batch_progress(handle)
    except RPCError:
        progress = None
    if progress:
        data |= {
            "total": progress.total,
            "completed": progress.completed,
            "failed": progress.failed,
            "running": progress.running,
            "mean_score": progress.mean_score,
            "stop_reasons": progress.stop_reasons,
            "stop_details": progress.stop_details,
            "output": progress.output,
        }
    if described.status == WorkflowExecutionStatus.RUNNING:
        data["retrying"] = [
            note.model_dump() | {"headline": note.headline} for note in await waiting_on_retries(client, batch_id)
        ]
    elif described.status == WorkflowExecutionStatus.FAILED:
        try:
            await handle.result()
        except WorkflowFailureError as err:
            data["error"] = root_cause(err)
    return {**data, "status": batch_outcome(status, data.get("completed"), data.get("failed"))}


async def cancel_batch(client: Client, batch_id: str) -> None:
    """Cancel a running batch: its running rollouts are cancelled too, and each releases its slot on the way out."""
    described = await require_workflow(client, batch_id, BATCH)
    if described.status != WorkflowExecutionStatus.RUNNING:
        raise ConfigError(f"batch {batch_id} is not running (it is {status_name(described.status)})")
    await client.get_workflow_handle(batch_id).cancel()
