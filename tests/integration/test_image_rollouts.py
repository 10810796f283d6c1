"""Rollouts of items with images, through the worker, on the real local backend: each of the image tasks
scores 1.0 with the demo policy and 0 when the model does nothing, a second batch builds nothing, and a
failed build is the item's failure, not a score, until the Dockerfile is fixed and the rollout resumed."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from temporal_rollouts.core.images import ImageSpec
from temporal_rollouts.core.records import BatchInput, BatchResult, StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.support.images import needs_image_tools, write_context
from tests.support.processes import run_rollouts_cli
from tests.support.servers.process import free_port
from tests.support.waiting import leased_slots
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

pytestmark = [needs_image_tools, pytest.mark.slow, pytest.mark.timeout(900)]

IMAGE_TASKS = 3


async def run_failing(client: Client, settings: Settings, input: TrajectoryInput, rollout: str) -> TrajectoryResult:
    with pytest.raises(WorkflowFailureError) as caught:
        await client.execute_workflow(
            TrajectoryWorkflow.run, input, id=rollout, task_queue=settings.temporal.task_queue
        )
    failure = caught.value.cause
    assert isinstance(failure, ApplicationError) and failure.type == "RolloutFailed"
    return TrajectoryResult.model_validate(failure.details[0])


async def run_batch(client: Client, settings: Settings, policy: str | None = None) -> BatchResult:
    batch = BatchInput(env="image_tasks", num_items=IMAGE_TASKS, group_size=1, policy=policy)
    return await client.execute_workflow(
        BatchWorkflow.run, batch, id=f"images-{uuid.uuid4().hex[:8]}", task_queue=settings.temporal.task_queue
    )


async def rollout_results(client: Client, batch_id: str) -> list[TrajectoryResult]:
    results = []
    async for execution in client.list_workflows(
        f"WorkflowType = 'TrajectoryWorkflow' AND RolloutBatchId = '{batch_id}'"
    ):
        results.append(TrajectoryResult.model_validate(await client.get_workflow_handle(execution.id).result()))
    return results


@pytest.fixture
async def do_nothing_policy() -> AsyncIterator[str]:
    """A model that answers every turn at once without calling a tool: the agent does nothing."""

    async def complete(request: Request) -> JSONResponse:
        message = {"role": "assistant", "content": "I will not do anything."}
        choice = {"index": 0, "message": message, "finish_reason": "stop", "logprobs": None}
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        return JSONResponse(
            {"id": "x", "object": "chat.completion", "created": 0, "model": "m", "choices": [choice], "usage": usage}
        )

    port = free_port()
    app = Starlette(routes=[Route("/v1/chat/completions", complete, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    task = asyncio.create_task(server.serve())
    while not server.started:
        await asyncio.sleep(0.05)
    yield f"http://127.0.0.1:{port}/v1"
    server.should_exit = True
    await task


async def test_the_image_tasks_score_1_with_the_demo_policy_0_when_nothing_is_done_and_build_once(
    client: Client, settings: Settings, pool: SandboxPool, do_nothing_policy: str
) -> None:
    solved = await run_batch(client, settings)
    assert (solved.completed, solved.failed, solved.mean_score) == (IMAGE_TASKS, 0, 1.0), solved.stop_details
    first = await rollout_results(client, solved.batch_id)
    assert all(result.image and result.image.startswith("localhost/rollouts/") for result in first)

    untouched = await run_batch(client, settings, policy=do_nothing_policy)
    assert (untouched.completed, untouched.failed, untouched.mean_score) == (IMAGE_TASKS, 0, 0.0)
    second = await rollout_results(client, untouched.batch_id)
    assert {r.stop_reason for r in second} == {StopReason.COMPLETED}, "scored: the model stopped, nothing broke"
    assert max(r.timings["image"] for r in second) < 5, "a second batch over built images builds nothing"
    assert {r.image for r in second} == {r.image for r in first}
    assert await leased_slots(pool) == []
    described = {container.image for container in await pool.describe()}
    assert {r.image for r in first} <= described, "each image's container shows its image"


async def test_a_failed_build_stops_the_rollout_unscored_and_resumes_once_the_dockerfile_is_fixed(
    client: Client, settings: Settings, pool: SandboxPool, tmp_path: Path
) -> None:
    context = write_context(tmp_path / "task", "FROM debian:bookworm-slim\nRUN echo no-such-package-here && exit 100\n")
    item = Item(id="csv-to-json", image=ImageSpec(context=str(context), name="csv-task"))
    rollout = f"image-{uuid.uuid4().hex[:8]}"
    failed = await run_failing(client, settings, TrajectoryInput(env="terminal_tasks", item=item), rollout)
    assert failed.stop_reason is StopReason.IMAGE_BUILD_FAILED and not failed.stop_reason.scored
    assert "no-such-package-here" in failed.stop_detail and failed.score == 0.0
    assert failed.turns == 0 and failed.transcript is None, "no slot was taken, no model turn spent"
    assert "image" in failed.timings and "acquire" not in failed.timings
    assert await leased_slots(pool) == []

    write_context(  # the fix: the task's check and the verifier's fingerprint need python3
        context,
        "FROM debian:bookworm-slim\n"
        "RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*\n"
        "WORKDIR /workspace\n",
    )
    await asyncio.to_thread(run_rollouts_cli, settings, "resume", rollout, "--json")
    result = TrajectoryResult.model_validate(await client.get_workflow_handle(rollout).result())
    assert (result.stop_reason, result.score) == (StopReason.COMPLETED, 1.0), result.verify_details
    assert result.image is not None and result.image.startswith("localhost/rollouts/csv-task:")
    assert await leased_slots(pool) == []
