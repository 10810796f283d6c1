"""The trainer door in the control layer: a training run's Updates (take, acknowledge, release,
register) and status query, and its batches' groups read back from the object store. The door's
endpoint (`temporal_rollouts/door/`) serves this over HTTP.

Nothing here keeps state between requests. Every take, acknowledgement and registration is an
Update of the run's workflow (durable, ordered, whichever endpoint process sent it); a batch's
groups are read from the object store by the keys the Update answered with. So any number of
endpoints may serve one run, and any of them may die: a take whose answer was lost is sent again
under the same request id (Temporal answers a repeated Update id with the first answer), or its
lease runs out and the batch is handed out again.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio.client import Client, WorkflowUpdateFailedError, WorkflowUpdateRPCTimeoutOrCancelledError
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from temporal_rollouts.client.connection import command_client
from temporal_rollouts.core.door import (
    AckAnswer,
    AckRequest,
    BatchGroup,
    Delivery,
    RegisterRequest,
    ReleaseRequest,
    TakeAnswer,
    TakeRequest,
)
from temporal_rollouts.core.feed import DoorStatus, FeedStatus
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.token_trace import IGNORE_INDEX
from temporal_rollouts.storage.feed_groups import FeedGroupStore
from temporal_rollouts.storage.objects import object_client

ANSWER_WAIT_S = 30.0
"""How long an Update or query may wait for a worker before the endpoint answers 503 (the client retries)."""


class DoorRefused(Exception):
    """A request the run cannot serve; `status` is the HTTP status the endpoint answers with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class RunDoors:
    """The door of every training run a Temporal client can reach."""

    def __init__(self, client: Client, groups: FeedGroupStore, answer_wait_s: float = ANSWER_WAIT_S) -> None:
        self._client = client
        self._groups = groups
        self._answer_wait_s = answer_wait_s

    async def register(self, run: str, request: RegisterRequest) -> DoorStatus:
        return await self._update(run, "register_trainer", request, DoorStatus)

    async def take(self, run: str, request: TakeRequest, request_id: str | None = None) -> dict[str, Any]:
        """`{"batch": ... | None, "acknowledged_below", "next_number"}`: the batch with its groups as trainers
        read them (atroposlib's ScoredDataGroup fields, the versions, the tree, the door's marks)."""
        try:
            answer = await self._update(run, "take_batch", request, TakeAnswer, request_id)
        except DoorRefused as refused:
            if refused.status != 204:
                raise
            status = await self.status(run)
            door = status.door
            if status.phase == "done" and door is not None and door.pending_groups == 0 and door.batches_out == 0:
                raise DoorRefused(410, f"training run {run} is done: every batch was acknowledged") from None
            return {
                "batch": None,
                "acknowledged_below": door.acknowledged_below if door else 0,
                "next_number": door.next_number if door else 0,
            }
        batch = None if answer.batch is None else await self._delivered(run, answer.batch)
        return {"batch": batch, "acknowledged_below": answer.acknowledged_below, "next_number": answer.next_number}

    async def acknowledge(self, run: str, request: AckRequest) -> AckAnswer:
        return await self._update(run, "ack_batch", request, AckAnswer)

    async def release(self, run: str, request: ReleaseRequest) -> None:
        await self._update(run, "release_batch", request, None)

    async def status(self, run: str) -> FeedStatus:
        handle = self._client.get_workflow_handle(run)
        try:
            return await asyncio.wait_for(
                handle.query("status", result_type=FeedStatus, rpc_timeout=timedelta(seconds=self._answer_wait_s)),
                self._answer_wait_s + 5,
            )
        except RPCError as err:
            raise _refusal(run, err) from None
        except TimeoutError:
            raise DoorRefused(503, f"no worker answered for training run {run}; try again") from None

    async def _delivered(self, run: str, delivery: Delivery) -> dict[str, Any]:
        try:
            groups = await asyncio.gather(*(self._group(entry, delivery.number) for entry in delivery.groups))
        except KeyError as err:
            raise DoorRefused(502, f"a group of batch {delivery.number} is missing from the object store: {err}")
        return {
            "run": run,
            "number": delivery.number,
            "lease": delivery.lease,
            "deadline": delivery.deadline,
            "deliveries": delivery.deliveries,
            "trainer_version": delivery.trainer_version,
            "final": delivery.final,
            "groups": groups,
        }

    async def _group(self, entry: BatchGroup, number: int) -> dict[str, Any]:
        group = await self._groups.get(entry.group.key)
        for index in entry.masked:
            group["masks"][index] = [IGNORE_INDEX] * len(group["masks"][index])
        group["group_overrides"] = {
            **(group.get("group_overrides") or {}),
            "group_id": entry.group.group_id,
            "staleness": entry.staleness,
            "stale": entry.stale,
            "masked": entry.masked,
            "held_back": entry.held_back,
            "batch": number,
        }
        group.setdefault("metadata", {})["staleness"] = entry.staleness
        return group

    async def _update(self, run: str, name: str, request: Any, result_type: Any, update_id: str | None = None) -> Any:
        handle = self._client.get_workflow_handle(run)
        try:
            return await asyncio.wait_for(
                handle.execute_update(
                    name,
                    request,
                    id=update_id,
                    result_type=result_type,
                    rpc_timeout=timedelta(seconds=self._answer_wait_s),
                ),
                self._answer_wait_s + 5,
            )
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if isinstance(cause, ApplicationError) and cause.type == "NoBatchYet":
                raise DoorRefused(204, "no batch yet") from None
            if isinstance(cause, ApplicationError) and cause.type == "RunStarting":
                raise DoorRefused(503, f"training run {run} is starting; try again") from None
            message = cause.message if isinstance(cause, ApplicationError) else str(cause)
            raise DoorRefused(409, message) from None
        except RPCError as err:
            raise _refusal(run, err) from None
        except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):
            raise DoorRefused(503, f"no worker answered for training run {run}; try again") from None


async def run_doors(settings: Settings) -> RunDoors:
    """The doors of the training runs the settings' Temporal and object store hold (refused, in one line, where
    the task queue's workers keep their data elsewhere: their groups would not be found)."""
    objects = object_client(settings)
    client = await command_client(settings, objects=objects, start_embedded=False)
    return RunDoors(client, FeedGroupStore(objects, settings.storage.bucket))


def _refusal(run: str, err: RPCError) -> DoorRefused:
    if err.status == RPCStatusCode.NOT_FOUND:
        if "completed" in err.message or "closed" in err.message:
            return DoorRefused(410, f"training run {run} has ended")
        return DoorRefused(404, f"no training run {run}")
    # FAILED_PRECONDITION among others: an Update that met the run while it continued as new ("unexpected
    # workflow task failure"); asked again, the next run answers it
    return DoorRefused(503, f"Temporal could not be asked about training run {run}: {err.message}; try again")
