"""The training feed against the real `run-api`, the real worker and sandbox, and a token-level policy
(SmolLM2 behind the CPU `/generate` server, steered by the demo policy): groups arrive once, every
turn says which weights produced it (the server's own word: never run-api's step), admission holds the staleness bound while the trainer stalls
and lets groups start again when it steps, and a rollout that fails for a machinery reason is
resumed and its group still posted once."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from temporal_rollouts.core.feed import FeedInput, FeedStatus
from temporal_rollouts.core.records import RolloutLimits, Sampling
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.policy_servers.weights import save_weights
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from tests.support.servers.fixtures import GenerateServerProcess, generate_policy
from tests.support.servers.run_api import RunApiProcess, pull_batch, register_trainer
from tests.support.waiting import leased_slots, reap_closed_holders
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
    fields = {
        "env": "echo_chain",
        "env_config": {"steps": 1},
        "policy": policy,
        "group_size": GROUP_SIZE,
        "sink": "atropos",
        "api_url": run_api.url,
        "max_staleness": 0,
        "max_groups_in_flight": 8,
        "sampling": Sampling(temperature=1.0, max_tokens=8),
        "limits": RolloutLimits(max_turns=3),
    }
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
    handle = await client.start_workflow(
        TrainingFeedWorkflow.run,
        feed_input(run_api, smol, max_groups=4),
        id=run,
        task_queue=settings.temporal.task_queue,
    )
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
    # This trainer steps without publishing weights: the server serves the weights it started with (version 0)
    # throughout, so the second batch's turns are one version behind run-api's step 1, and say so.
    assert done.figures.staleness == {"0": 2, "1": 2} and done.figures.groups_stale == 2, done.figures
    for batch, step in ((first, 0), (second, 1)):
        assert len(batch) == 2
        for group in batch:
            versions = [v for override in group["overrides"] for v in override["policy_versions"]]
            assert versions and all(v == 0 for v in versions), (step, group["overrides"])
            assert group["group_overrides"]["staleness"] == step
            assert group["group_overrides"]["group_id"].startswith(f"{run}/g")
            assert group["inference_logprobs"] and len(group["tokens"]) == GROUP_SIZE
    ids = [g["group_overrides"]["group_id"] for g in first + second]
    assert len(set(ids)) == 4, "every group once"
    assert done.figures.tokens_posted > 0 and done.figures.tokens_generated >= done.figures.tokens_posted


@pytest.fixture(scope="module")
def weights(smollm2_model, tmp_path_factory) -> Path:
    """The served model's own weights on disk: a trainer that publishes them as each new version."""
    return save_weights(smollm2_model, tmp_path_factory.mktemp("weights") / "same")


@pytest.fixture
def own_smol(settings: Settings, own_smollm2_server: GenerateServerProcess) -> Iterator[GenerateServerProcess]:
    settings.policies["own-smol"] = generate_policy(own_smollm2_server)
    yield own_smollm2_server
    settings.policies.pop("own-smol", None)


async def publish(server: GenerateServerProcess, weights: Path, version: int) -> None:
    async with httpx.AsyncClient(timeout=600) as http:
        answer = await http.post(
            f"{server.url}/update_weights_from_disk", json={"model_path": str(weights), "weight_version": str(version)}
        )
    assert answer.json()["success"], answer.text


@pytest.mark.timeout(600)
async def test_a_trainer_slower_than_its_rollouts_never_gets_a_group_staler_than_the_bound(
    client: Client,
    settings: Settings,
    run_api: RunApiProcess,
    own_smol: GenerateServerProcess,
    weights: Path,
    tmp_path: Path,
) -> None:
    """run-api forms every full batch of its queue at one /batch call, counts them all as steps and hides
    them from its queue, handing the newest out first: a feed that went by run-api alone, or let two
    batches queue there, would have the trainer take groups sampled by weights it is several steps past.
    The trainer here pulls only once the feed has stopped starting groups and its rollouts are done,
    which is what a trainer slower than its rollouts sees."""
    await publish(own_smol, weights, 0)
    async with TrajectoryApi(run_api.url) as api:
        await register_trainer(api, batch_size=GROUP_SIZE, max_token_len=4096, checkpoint_dir=tmp_path)
        run = f"feed-slow-{uuid.uuid4().hex[:6]}"
        handle = await client.start_workflow(
            TrainingFeedWorkflow.run,
            feed_input(run_api, "own-smol", max_groups=5, max_staleness=1),
            id=run,
            task_queue=settings.temporal.task_queue,
        )
        lags: list[int] = []
        for step in range(1, 6):
            # This step's group posted, and nothing started since: on a loaded machine the feed may not yet have
            # started the step's group when the last one's weights arrive, and then nothing runs either.
            await until(
                handle,
                lambda s: (
                    s.phase == "done"
                    or (s.figures.groups_posted >= step and not s.admitted and s.rollouts_running == 0)
                ),
            )
            batch = await pull_batch(api, timeout_s=60)
            assert len(batch) == 1
            held = await status(handle)  # the batch being trained still counts against the bound
            assert held.phase == "done" or not held.admitted, held
            lags.append(step - 1 - batch[0]["group_overrides"]["policy_version_min"])
            # The training step. A clock, not a condition: whether the feed starts a group meanwhile (on the
            # weights being trained past) is what it decides, and it may rightly start none before new weights.
            await asyncio.sleep(5)
            await publish(own_smol, weights, step)
        done = await until(handle, lambda s: s.phase == "done")
    assert done.figures.groups_posted == 5 and done.figures.dropped == {}
    assert all(0 <= lag <= 1 for lag in lags), f"staleness at consumption per step: {lags}"


@pytest.mark.timeout(600)
async def test_a_rollout_the_machinery_lost_is_resumed_and_its_group_posted_once(
    client: Client, settings: Settings, run_api: RunApiProcess, trainer: TrajectoryApi, smol: str, pool
) -> None:
    run = f"feed-resume-{uuid.uuid4().hex[:6]}"
    slow = feed_input(run_api, smol, max_groups=1, max_staleness=1, env_config={"steps": 1, "sleep_s": 4})
    handle = await client.start_workflow(
        TrainingFeedWorkflow.run, slow, id=run, task_queue=settings.temporal.task_queue
    )
    await until(handle, lambda s: s.rollouts_running == GROUP_SIZE)
    await asyncio.sleep(2)
    await client.get_workflow_handle(f"{run}/g0/r0").terminate("the test plays an operator who killed it")
    done = await until(handle, lambda s: s.phase == "done")
    assert done.figures.rollouts_retried == 1 and done.figures.dropped == {}
    assert (done.figures.groups_posted, done.figures.groups_duplicated) == (1, 0)
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{run}/g0/r0'")]
    assert len(runs) == 2, "the terminated run, and the one that resumed it"
    # A terminated run never releases its slot itself: the reaper frees it, and only it.
    reaped = await reap_closed_holders(pool, client)
    assert [lease.holder.workflow_id for lease in reaped] == [f"{run}/g0/r0"]
    assert await leased_slots(pool) == []


@pytest.fixture
def demo_sft(settings: Settings, demo_policy, smollm2_server: GenerateServerProcess) -> Iterator[str]:
    """The demo policy with a local tokenizer: template-rendered tokens, no model server to wait on."""
    from temporal_rollouts.core.settings import ChatPolicy
    from tests.support import TEMPLATES

    settings.policies["demo-sft"] = ChatPolicy(
        base_url=f"{demo_policy.url}/v1",
        model="demo-policy",
        tokenizer=str(smollm2_server.tokenizer_dir),
        chat_template=str(TEMPLATES / "qwen2_5.jinja"),
    )
    yield "demo-sft"
    settings.policies.pop("demo-sft", None)


@pytest.mark.timeout(600)
async def test_the_feed_continues_as_new_without_waiting_for_its_rollouts_and_loses_nothing(
    settings: Settings, parts, demo_sft: str
) -> None:
    """On a server that suggests continue-as-new every 150 events, a run of 8 groups spans several runs
    while rollouts are in flight: every group is written once, nothing is dropped."""
    from temporal_rollouts.sinks.jsonl import read_groups
    from tests.support.fixtures import continue_as_new_server

    run = f"feed-can-{uuid.uuid4().hex[:6]}"
    feed = FeedInput(
        env="echo_chain",
        env_config={"steps": 2, "sleep_s": 1},
        policy=demo_sft,
        group_size=2,
        max_groups=8,
        max_groups_in_flight=3,
        sink="jsonl",
    )
    async with continue_as_new_server(settings, parts, after_events=150) as (client, own):
        handle = await client.start_workflow(TrainingFeedWorkflow.run, feed, id=run, task_queue=own.temporal.task_queue)
        done = await until(handle, lambda s: s.phase == "done", timeout_s=400)
        runs = [w async for w in client.list_workflows(f"WorkflowId = '{run}'")]
    assert len(runs) > 1, "the run continued as new"
    figures = done.figures
    assert (figures.groups_started, figures.groups_posted, figures.dropped) == (8, 8, {}), figures
    groups = read_groups(Path(done.output))
    assert len(groups) == 8 and len({g["metadata"]["group_id"] for g in groups}) == 8


@pytest.mark.timeout(600)
async def test_a_restarted_run_api_gets_the_run_registered_again_and_posting_goes_on(
    client: Client, settings: Settings, demo_sft: str, tmp_path: Path
) -> None:
    run_api = RunApiProcess(tmp_path / "run_api.log")
    run_api.start()
    run = f"feed-restart-{uuid.uuid4().hex[:6]}"
    try:
        async with TrajectoryApi(run_api.url) as api:
            await register_trainer(api, batch_size=2 * GROUP_SIZE, max_token_len=4096, checkpoint_dir=tmp_path)
            feed = FeedInput(
                env="echo_chain",
                env_config={"steps": 1},
                policy=demo_sft,
                group_size=GROUP_SIZE,
                sink="atropos",
                api_url=run_api.url,
                max_staleness=1,
                max_groups=6,
            )
            handle = await client.start_workflow(
                TrainingFeedWorkflow.run, feed, id=run, task_queue=settings.temporal.task_queue
            )
            before = await pull_batch(api, timeout_s=120)
        run_api.stop()  # what run-api held is lost with it; the trainer and the run register again
        run_api.start()
        async with TrajectoryApi(run_api.url) as api:
            await register_trainer(api, batch_size=2 * GROUP_SIZE, max_token_len=4096, checkpoint_dir=tmp_path)
            after = await pull_batch(api, timeout_s=240)
        done = await until(handle, lambda s: s.phase == "done" or s.figures.groups_posted == 6)
    finally:
        run_api.stop()
    assert len(before) == len(after) == 2
    assert {g["group_overrides"]["group_id"] for g in before}.isdisjoint(
        g["group_overrides"]["group_id"] for g in after
    )
    assert done.figures.dropped == {} and done.trainer.env_id is not None


@pytest.mark.timeout(600)
async def test_a_branching_feed_posts_each_group_as_one_tree(client: Client, settings: Settings, demo_sft: str) -> None:
    from temporal_rollouts.core.forks import BranchSpec
    from temporal_rollouts.sinks.jsonl import read_groups

    run = f"feed-tree-{uuid.uuid4().hex[:6]}"
    feed = FeedInput(
        env="echo_chain",
        env_config={"steps": 3},
        policy=demo_sft,
        group_size=2,
        max_groups=2,
        sink="jsonl",
        branch=BranchSpec(at_turns=[1], factor=2),
    )
    handle = await client.start_workflow(
        TrainingFeedWorkflow.run, feed, id=run, task_queue=settings.temporal.task_queue
    )
    done = await until(handle, lambda s: s.phase == "done", timeout_s=400)
    assert (done.figures.groups_posted, done.figures.dropped) == (2, {}), done.figures
    # A finished tree wakes the run at once: no timer fired (its wait for news ends by CHECK_ROLLOUTS_S
    # otherwise, 2 minutes for every tree).
    fired = [
        e.event_id async for e in handle.fetch_history_events() if e.event_type == EventType.EVENT_TYPE_TIMER_FIRED
    ]
    assert fired == [], f"the run waited out a timer instead of hearing its trees (events {fired})"
    assert done.figures.rollouts_started == 8, "two roots a group, each branching into two after turn 1"
    groups = read_groups(Path(done.output))
    assert len(groups) == 2
    for group in groups:
        assert len(group["scores"]) == 4 and group["scores"] == [1.0] * 4
        points = group["group_overrides"]["tree"]["branch_points"]
        assert len(points) == 2 and all(point["turn"] == 1 for point in points)
        assert sum(1 for override in group["overrides"] if override.get("parent")) == 2
