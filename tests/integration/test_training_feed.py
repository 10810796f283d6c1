"""The training feed against the real `run-api`, the real worker and sandbox, and a token-level policy
(SmolLM2 behind the CPU `/generate` server, steered by the demo policy): groups arrive once, every
turn says which weights produced it, admission holds the staleness bound while the trainer stalls
and lets groups start again when it steps, and a rollout that fails for a machinery reason is
resumed and its group still posted once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowHandle

from temporal_rollouts.core.feed import FeedInput, FeedStatus
from temporal_rollouts.core.records import RolloutLimits, Sampling
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from tests.support.servers.fixtures import GenerateServerProcess, generate_policy
from tests.support.servers.run_api import RunApiProcess, pull_batch, register_trainer
from workflows.feed import TrainingFeedWorkflow

pytestmark = pytest.mark.slow

GROUP_SIZE = 2


@pytest.fixture
def run_api(tmp_path) -> Iterator[RunApiProcess]:
    server = RunApiProcess(tmp_path / "run_api.log")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def smol(settings: Settings, smollm2_server: GenerateServerProcess) -> Iterator[str]:
    settings.policies["smol"] = generate_policy(smollm2_server)
    yield "smol"
    settings.policies.pop("smol", None)


@pytest.fixture
async def trainer(run_api: RunApiProcess, tmp_path: Path) -> AsyncIterator[TrajectoryApi]:
    async with TrajectoryApi(run_api.url) as api:
        await register_trainer(api, batch_size=2 * GROUP_SIZE, max_token_len=4096, checkpoint_dir=tmp_path)
        yield api


def feed_input(run_api: RunApiProcess, policy: str, **changes) -> FeedInput:
    fields = {"env": "echo_chain", "env_config": {"steps": 1}, "policy": policy, "group_size": GROUP_SIZE,
              "api_url": run_api.url, "max_staleness": 0, "max_groups_in_flight": 8,
              "sampling": Sampling(temperature=1.0, max_tokens=8), "limits": RolloutLimits(max_turns=3)}
    return FeedInput(**{**fields, **changes})


async def status(handle: WorkflowHandle) -> FeedStatus:
    return FeedStatus.model_validate(await handle.query(TrainingFeedWorkflow.status))


async def until(handle: WorkflowHandle, check, timeout_s: float = 240.0) -> FeedStatus:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while True:
        now = await status(handle)
        if check(now):
            return now
        assert asyncio.get_running_loop().time() < deadline, f"the feed never got there: {now}"
        await asyncio.sleep(0.5)


@pytest.mark.timeout(600)
async def test_admission_holds_the_bound_while_the_trainer_stalls_and_every_turn_has_its_version(
    client: Client, settings: Settings, run_api: RunApiProcess, trainer: TrajectoryApi, smol: str
) -> None:
    run = f"feed-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(TrainingFeedWorkflow.run, feed_input(run_api, smol, max_groups=4),
                                         id=run, task_queue=settings.temporal.task_queue)
    # max_staleness 0 and a batch of two groups: two groups may be outstanding, no more, while the trainer waits
    held = await until(handle, lambda s: s.figures.groups_posted == 2)
    await asyncio.sleep(5)
    held = await status(handle)
    assert (held.figures.groups_started, held.in_flight, held.admitted) == (2, 0, False), held
    assert held.trainer.queued == 2 and held.trainer.env_id is not None

    first = await pull_batch(trainer, timeout_s=30)  # the trainer steps: admission opens again
    done = await until(handle, lambda s: s.phase == "done")
    second = await pull_batch(trainer, timeout_s=30)

    assert done.figures.groups_started == done.figures.groups_posted == 4
    assert done.figures.dropped == {} and done.figures.groups_duplicated == 0
    assert set(done.figures.staleness) <= {"0"}, done.figures.staleness
    for batch, step in ((first, 0), (second, 1)):
        assert len(batch) == 2
        for group in batch:
            versions = [v for override in group["overrides"] for v in override["policy_versions"]]
            assert versions and all(v == step for v in versions), (step, group["overrides"])
            assert group["group_overrides"]["group_id"].startswith(f"{run}/g")
            assert group["inference_logprobs"] and len(group["tokens"]) == GROUP_SIZE
    ids = [g["group_overrides"]["group_id"] for g in first + second]
    assert len(set(ids)) == 4, "every group once"
    assert done.figures.tokens_posted > 0 and done.figures.tokens_generated >= done.figures.tokens_posted


@pytest.mark.timeout(600)
async def test_a_rollout_the_machinery_lost_is_resumed_and_its_group_posted_once(
    client: Client, settings: Settings, run_api: RunApiProcess, trainer: TrajectoryApi, smol: str
) -> None:
    run = f"feed-resume-{uuid.uuid4().hex[:6]}"
    slow = feed_input(run_api, smol, max_groups=1, max_staleness=1, env_config={"steps": 1, "sleep_s": 4})
    handle = await client.start_workflow(TrainingFeedWorkflow.run, slow, id=run, task_queue=settings.temporal.task_queue)
    await until(handle, lambda s: s.rollouts_running == GROUP_SIZE)
    await asyncio.sleep(2)
    await client.get_workflow_handle(f"{run}/g0/r0").terminate("the test plays an operator who killed it")
    done = await until(handle, lambda s: s.phase == "done")
    assert done.figures.rollouts_retried == 1 and done.figures.dropped == {}
    assert (done.figures.groups_posted, done.figures.groups_duplicated) == (1, 0)
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{run}/g0/r0'")]
    assert len(runs) == 2, "the terminated run, and the one that resumed it"
