"""What a resumed rollout, or a batch gathering again, needs to know about earlier runs.

A failed run carries its TrajectoryResult in its failure; a terminated or timed-out run
is asked through its `resume_state` query, which Temporal answers by replaying its
history, so even a run killed from the outside tells how far it got.
"""

from __future__ import annotations

import asyncio
from typing import TypeVar

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError
from temporalio.contrib.aws.s3driver import S3StorageDriverClient
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.core.errors import ConfigError, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.records import TrajectoryInput, TrajectoryResult, failed_rollout_result
from temporal_rollouts.core.settings import StorageSettings
from temporal_rollouts.storage.snapshots import snapshot_key

POLL_S = 2.0
M = TypeVar("M", bound=BaseModel)


class RunRef(BaseModel):
    workflow_id: str
    run_id: str | None = None


class ResumePoint(BaseModel):
    result: TrajectoryResult
    snapshot: str | None = None


class RolloutOutcome(BaseModel):
    status: str
    run_id: str | None = None
    result: TrajectoryResult | None = None


async def run_result(client: Client, workflow_id: str, run_id: str | None = None) -> TrajectoryResult | None:
    """The result a closed rollout run ended with, failed or not; None if it left none."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        return TrajectoryResult.model_validate(await handle.result(follow_runs=False))
    except WorkflowFailureError as err:
        if (result := failed_rollout_result(err.cause)) is not None:
            return result
    try:
        return TrajectoryResult.model_validate(await handle.query("resume_state"))
    except RPCError:
        return None


async def run_input(client: Client, workflow_id: str, run_id: str | None, model: type[M]) -> M:
    """The input a run was started with, read from its history (the latest run's, when `run_id` is None)."""
    history = await client.get_workflow_handle(workflow_id, run_id=run_id).fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [value] = await client.data_converter.decode(payloads, [model])
    return value


class ResumeActivities:
    def __init__(self, client: Client, objects: S3StorageDriverClient, storage: StorageSettings) -> None:
        self._client = client
        self._objects = objects
        self._storage = storage

    @activity.defn(name="load_resume_point")
    @checked_input
    async def load_resume_point(self, input: RunRef) -> ResumePoint:
        with activity_boundary():
            assert input.run_id
            handle = self._client.get_workflow_handle(input.workflow_id, run_id=input.run_id)
            try:
                described = await handle.describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    raise ConfigError(f"no run {input.run_id} of rollout {input.workflow_id} to resume from") from err
                raise
            if described.status == WorkflowExecutionStatus.RUNNING:
                raise ConfigError(f"run {input.run_id} of {input.workflow_id} is still running")
            result = await run_result(self._client, input.workflow_id, input.run_id)
            if result is None:
                raise ConfigError(f"run {input.run_id} of {input.workflow_id} left no state to resume from")
            key = result.snapshot or snapshot_key(input.workflow_id, input.run_id)
            exists = await self._objects.object_exists(bucket=self._storage.bucket, key=key)
            return ResumePoint(result=result, snapshot=key if exists else None)

    @activity.defn(name="rollout_outcome")
    @checked_input
    async def rollout_outcome(self, input: RunRef) -> RolloutOutcome:
        """How the latest run of a rollout stands: not started, running, or closed with its result."""
        with activity_boundary():
            handle = self._client.get_workflow_handle(input.workflow_id)
            try:
                described = await handle.describe()
            except RPCError as err:
                if err.status == RPCStatusCode.NOT_FOUND:
                    return RolloutOutcome(status="not_found")
                raise
            status = described.status.name.lower() if described.status else "unknown"
            if described.status == WorkflowExecutionStatus.RUNNING:
                return RolloutOutcome(status=status, run_id=described.run_id)
            result = await run_result(self._client, input.workflow_id, described.run_id)
            return RolloutOutcome(status=status, run_id=described.run_id, result=result)

    @activity.defn(name="await_rollout")
    @checked_input
    async def await_rollout(self, input: RunRef) -> RolloutOutcome:
        """Wait, heartbeating, for a rollout that something else started to close."""
        with activity_boundary():
            while True:
                outcome = await self.rollout_outcome(input)
                if outcome.status != "running":
                    return outcome
                activity.heartbeat()
                await asyncio.sleep(POLL_S)

    @activity.defn(name="started_input")
    @checked_input
    async def started_input(self, input: RunRef) -> TrajectoryInput:
        """The input a rollout's first run was started with (a branch's own, which only its history holds)."""
        with activity_boundary():
            started = await run_input(self._client, input.workflow_id, input.run_id, TrajectoryInput)
            return started.model_copy(update={"resume_from_run": None})
