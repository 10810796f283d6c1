"""Rollouts of items with images, through the worker: a failed build is the item's failure, not a score."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from temporal_rollouts.core.images import ImageSpec
from temporal_rollouts.core.records import StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.support.images import needs_image_tools, write_context
from tests.support.waiting import leased_slots
from workflows.trajectory import TrajectoryWorkflow

pytestmark = [needs_image_tools, pytest.mark.timeout(600)]


async def run_failing(client: Client, settings: Settings, input: TrajectoryInput) -> TrajectoryResult:
    with pytest.raises(WorkflowFailureError) as caught:
        await client.execute_workflow(
            TrajectoryWorkflow.run, input, id=f"image-{uuid.uuid4().hex[:8]}", task_queue=settings.temporal.task_queue
        )
    failure = caught.value.cause
    assert isinstance(failure, ApplicationError) and failure.type == "RolloutFailed"
    return TrajectoryResult.model_validate(failure.details[0])


async def test_a_failed_build_stops_the_rollout_unscored_with_the_logs_tail(
    client: Client, settings: Settings, pool: SandboxPool, tmp_path: Path
) -> None:
    context = write_context(
        tmp_path / "broken", "FROM debian:bookworm-slim\nRUN echo no-such-package-here && exit 100\n"
    )
    item = Item(id="csv-to-json", image=ImageSpec(context=str(context), name="broken"))
    result = await run_failing(client, settings, TrajectoryInput(env="terminal_tasks", item=item))
    assert result.stop_reason is StopReason.IMAGE_BUILD_FAILED and not result.stop_reason.scored
    assert "no-such-package-here" in result.stop_detail and result.score == 0.0
    assert result.turns == 0 and result.transcript is None, "no slot was taken, no model turn spent"
    assert "image" in result.timings and "acquire" not in result.timings
    assert await leased_slots(pool) == []
