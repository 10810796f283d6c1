"""The trainer door end to end on the real dev server: the real TrainingFeedWorkflow, the real endpoint
process (`python -m temporal_rollouts.door`, killed mid-run), the real object store and the trainer's
Python client. The rollouts and the group-building activity are stand-ins the test drives, so it can
make groups finish out of order, with the weight versions it chooses, against a slow trainer.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.envs import LoadedItems, LoadItemsInput
from activities.feed import FeedCheck, FeedCheckInput, FeedGroupInput, FeedGroupOutcome, RunsToCheck
from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.feed import FeedInput, FeedStatus
from temporal_rollouts.core.records import ROLLOUT_FINISHED, StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.door.client import Batch, DoorClient, DoorClientError
from temporal_rollouts.runtime.temporal import SUGGEST_CONTINUE_AS_NEW, fast_step_flags, temporal_binary
from temporal_rollouts.storage.feed_groups import FeedGroupStore
from temporal_rollouts.storage.objects import object_client
from tests.support.servers.door import DoorProcess
from tests.support.servers.process import free_port
from tests.support.waiting import wait_until
from workflows.feed import TrainingFeedWorkflow

GROUP_SIZE = 2


@workflow.defn(name="TrajectoryWorkflow")
class HeldRollout:
    """A rollout that ends, scored, when the test signals `finish` with the weight version that made it."""

    def __init__(self) -> None:
        self._version: int | None = None

    @workflow.signal
    def finish(self, version: int) -> None:
        self._version = version

    @workflow.run
    async def run(self, input: TrajectoryInput) -> TrajectoryResult:
        await workflow.wait_condition(lambda: self._version is not None)
        result = TrajectoryResult(
            rollout_id=workflow.info().workflow_id,
            env=input.env,
            item_id=input.item.id,
            group_index=input.group_index,
            score=float(input.group_index),
            stop_reason=StopReason.COMPLETED,
            policy_versions=[self._version],
            completion_tokens=3,
            run_id=workflow.info().run_id,
        )
        if input.notify:  # as a real rollout tells its run (whichever run of it is current) that it ended
            await workflow.get_external_workflow_handle(input.notify).signal(ROLLOUT_FINISHED, result)
        return result


@dataclass
class StandIns:
    """The feed's activities, but for the group: written to the real object store as the real one writes it."""

    store: FeedGroupStore
    stored: list[str] = field(default_factory=list)

    @activity.defn(name="check_feed")
    async def check_feed(self, input: FeedCheckInput) -> FeedCheck:
        return FeedCheck(allow_network=False, item_count=None)

    @activity.defn(name="load_items")
    async def load_items(self, input: LoadItemsInput) -> LoadedItems:
        return LoadedItems(items=[Item(id=f"item-{input.offset + k}") for k in range(input.count)], allow_network=False)

    @activity.defn(name="post_feed_group")
    async def post_feed_group(self, input: FeedGroupInput) -> FeedGroupOutcome:
        assert input.sink == "door" and input.door_key
        size = len(input.results)
        await self.store.put(
            input.door_key,
            {
                "tokens": [[7, 8, 9]] * size,
                "masks": [[-100, 8, 9]] * size,
                "scores": [r.score for r in input.results],
                "inference_logprobs": [[1.0, -0.5, -0.25]] * size,
                "overrides": [
                    {"rollout_id": r.rollout_id, "policy_versions": r.policy_versions} for r in input.results
                ],
                "group_overrides": {"group_id": input.group_id},
                "metadata": {"item_id": input.results[0].item_id},
            },
        )
        self.stored.append(input.group_id)
        return FeedGroupOutcome(status="posted", tokens_posted=2 * size, turns=size)

    @activity.defn(name="check_feed_rollouts")
    async def check_feed_rollouts(self, input: RunsToCheck) -> list[TrajectoryResult]:
        return []


@dataclass
class Stage:
    client: Client
    queue: str
    door: DoorProcess
    stand_ins: StandIns


@contextlib.asynccontextmanager
async def staged(env: WorkflowEnvironment, folder: Path) -> AsyncIterator[Stage]:
    """The door's endpoint over `env`'s server and a store in `folder`, and a worker with the stand-ins."""
    address = env.client.service_client.config.target_host
    settings = Settings(data_dir=folder / "data", temporal={"address": address})
    stand_ins = StandIns(FeedGroupStore(object_client(settings), settings.storage.bucket))
    queue = f"door-{uuid.uuid4().hex[:6]}"
    door = DoorProcess(folder / "door.log", address, settings.data_dir)
    door.start()
    try:
        async with Worker(
            env.client,
            task_queue=queue,
            workflows=[TrainingFeedWorkflow, HeldRollout],
            activities=[
                stand_ins.check_feed,
                stand_ins.load_items,
                stand_ins.post_feed_group,
                stand_ins.check_feed_rollouts,
            ],
            workflow_runner=UnsandboxedWorkflowRunner(),
        ):
            yield Stage(env.client, queue, door, stand_ins)
    finally:
        door.stop()


@pytest.fixture
async def stage(temporal_env: WorkflowEnvironment, tmp_path: Path) -> AsyncIterator[Stage]:
    async with staged(temporal_env, tmp_path) as ready:
        yield ready


async def status(feed: WorkflowHandle) -> FeedStatus:
    return FeedStatus.model_validate(await feed.query(TrainingFeedWorkflow.status))


async def finish(client: Client, run: str, group: int, version: int) -> None:
    for index in range(GROUP_SIZE):
        await client.get_workflow_handle(f"{run}/g{group}/r{index}").signal(HeldRollout.finish, version)


async def take(door: DoorClient, run: str, **options) -> Batch:
    """The next batch, waiting (in a thread: the client is synchronous, as trainers are) until there is one."""
    for _ in range(200):
        batch = await asyncio.to_thread(door.take, run, **options)
        if batch is not None:
            return batch
        await asyncio.sleep(0.1)
    raise AssertionError("no batch came")


def ids(batch: Batch) -> list[str]:
    return [group["group_overrides"]["group_id"] for group in batch.groups]


async def test_groups_that_finish_out_of_order_reach_a_slow_trainer_within_the_bound_or_start_again(stage) -> None:
    client, run = stage.client, f"door-{uuid.uuid4().hex[:6]}"
    feed = await client.start_workflow(
        TrainingFeedWorkflow.run,
        FeedInput(
            env="echo_chain",
            group_size=GROUP_SIZE,
            batch_size=2 * GROUP_SIZE,
            max_staleness=1,
            stale_groups="requeue",
            max_groups=8,
        ),
        id=run,
        task_queue=stage.queue,
    )

    async def started(n: int) -> bool:
        now = await status(feed)
        return now.figures.groups_started == n and not now.admitted

    door = DoorClient(stage.door.url)
    batches: list[Batch] = []

    stored = 0

    async def step(*finished: tuple[int, int]) -> Batch:
        nonlocal stored
        for group, version in finished:
            await finish(client, run, group, version)
        stored += len(finished)
        await wait_until(lambda: _stored(feed, stored))  # every group of the step is in before the trainer asks
        batch = await take(door, run)
        batches.append(batch)
        assert await asyncio.to_thread(batch.ack) == "acknowledged"
        return batch

    # Two groups a batch, staleness 1: four groups may be outstanding while the trainer trains version 0.
    await wait_until(lambda: started(4))
    assert sorted(ids(await step((1, 0), (2, 0)))) == [f"{run}/g1", f"{run}/g2"]  # g0 is slow
    await wait_until(lambda: started(6))  # acknowledged: the trainer trains version 1, two more start
    assert ids(await step((3, 0), (4, 1))) == [f"{run}/g3", f"{run}/g4"]
    await wait_until(lambda: started(8))
    # g0 ends now, sampled by version 0: at version 2 it is two steps stale. It is not trained: its item starts again.
    third = await step((0, 0), (5, 1), (6, 2))
    assert ids(third) == [f"{run}/g5", f"{run}/g6"]
    await wait_until(lambda: started(9))
    fourth = await step((7, 2), (8, 3))
    assert ids(fourth) == [f"{run}/g7", f"{run}/g8"]

    done = await feed.result()
    assert done.phase == "done"
    assert [b.number for b in batches] == [0, 1, 2, 3] and [b.trainer_version for b in batches] == [0, 1, 2, 3]
    staleness = [g["group_overrides"]["staleness"] for b in batches for g in b.groups]
    assert max(staleness) <= 1 and not any(s.stale for b in batches for s in b.sequences())
    d = done.door.figures
    assert (d.groups_requeued, d.groups_marked_stale, d.groups_dropped_stale) == (1, 0, 0)
    assert (d.batches_acknowledged, d.groups_acknowledged, d.batches_redelivered) == (4, 8, 0)
    assert done.figures.groups_started == 9 and done.figures.groups_posted == 9, "g0 was built; g8 is its item again"
    assert fourth.groups[1]["metadata"]["item_id"] == "item-0", "the slow group's item, started again"
    # every generated token reached the trainer once, after acknowledgement
    assert d.completion_tokens_acknowledged == 8 * GROUP_SIZE * 3
    seqs = [s for b in batches for s in b.sequences()]
    assert len(seqs) == 16 and all(s.trainable() == [1, 2] and len(s.versions) == 1 for s in seqs)
    with pytest.raises(DoorClientError) as ended:
        await asyncio.to_thread(door.take, run)
    assert ended.value.status == 410


async def test_a_killed_endpoint_and_an_expired_lease_lose_nothing_and_acknowledge_once(stage) -> None:
    client, run = stage.client, f"door-{uuid.uuid4().hex[:6]}"
    feed = await client.start_workflow(
        TrainingFeedWorkflow.run,
        FeedInput(env="echo_chain", group_size=GROUP_SIZE, max_staleness=3, max_groups=4),
        id=run,
        task_queue=stage.queue,
    )
    await asyncio.sleep(1)
    assert (await status(feed)).figures.groups_started == 0, "no batch size yet: nothing may start"
    door = DoorClient(stage.door.url)
    registered = await asyncio.to_thread(door.register, run, GROUP_SIZE)
    assert registered["batch_size"] == GROUP_SIZE
    await wait_until(lambda: _started(feed, 4))
    await finish(client, run, 0, 0)
    await finish(client, run, 1, 0)

    first = await take(door, run, lease_s=2)
    assert (first.number, first.deliveries) == (0, 1)
    stage.door.kill()  # the trainer's endpoint dies with the batch out and unacknowledged
    stage.door.start()
    await asyncio.sleep(2.2)
    again = await take(door, run, lease_s=60)
    assert (again.number, again.deliveries, ids(again)) == (0, 2, ids(first)), "the same batch, handed out again"
    assert await asyncio.to_thread(first.ack) == "acknowledged", "the first taker trained it: it counts"
    assert await asyncio.to_thread(again.ack) == "already_acknowledged"

    # Atropos' trainer side: /batch hands out the next batch's groups and acknowledges the one before
    async with httpx.AsyncClient(base_url=f"{stage.door.url}/runs/{run}", timeout=60) as atropos:
        assert (await atropos.get("/info")).json() == {"batch_size": GROUP_SIZE, "max_token_len": -1}
        while (groups := (await atropos.get("/batch")).json()["batch"]) is None:  # g1 may still be being stored
            await asyncio.sleep(0.1)
        assert [g["group_overrides"]["group_id"] for g in groups] == [f"{run}/g1"]
        assert groups[0]["inference_logprobs"] and groups[0]["overrides"][0]["policy_versions"] == [0]
        assert (await atropos.get("/batch")).json() == {"batch": None}, "g2, g3 still run; batch 1 acknowledged"
        assert (await atropos.get("/status")).json() == {"current_step": 2, "queue_size": 0}
        await finish(client, run, 2, 2)
        await finish(client, run, 3, 2)
        seen = []
        while len(seen) < 2:
            batch = (await atropos.get("/batch")).json()["batch"]
            seen += [g["group_overrides"]["group_id"] for g in batch or []]
            await asyncio.sleep(0.1)
        assert sorted(seen) == [f"{run}/g2", f"{run}/g3"]  # both version 2: in the order they were stored
        assert (await atropos.get("/batch")).json() == {"batch": None}  # acknowledges the last: the run ends
    done = await feed.result()
    d = done.door.figures
    assert (d.batches_formed, d.batches_acknowledged, d.batches_redelivered, d.leases_expired) == (4, 4, 1, 1)
    assert d.acks_repeated == 1 and d.groups_acknowledged == 4


async def _stored(feed: WorkflowHandle, n: int) -> bool:
    return (await status(feed)).figures.groups_posted >= n


async def _started(feed: WorkflowHandle, n: int) -> bool:
    return (await status(feed)).figures.groups_started == n


async def test_the_endpoint_with_a_key_refuses_a_caller_without_it(temporal_env, tmp_path: Path) -> None:
    address = temporal_env.client.service_client.config.target_host
    door = DoorProcess(tmp_path / "door.log", address, tmp_path / "data", key="s3cret-door-key")
    door.start()
    try:
        async with httpx.AsyncClient(base_url=door.url, timeout=30) as http:
            assert (await http.get("/health")).status_code == 200
            assert (await http.get("/runs/nothing")).status_code == 401
            wrong = await http.get("/runs/nothing", headers={"Authorization": "Bearer s3cret-door-kez"})
            assert wrong.status_code == 401
            right = await http.get("/runs/nothing", headers={"Authorization": "Bearer s3cret-door-key"})
            assert right.status_code == 404 and "no training run nothing" in right.json()["error"]["message"]
    finally:
        door.stop()


async def test_the_ledger_and_the_trainer_go_on_across_continue_as_new(tmp_path: Path) -> None:
    """On a server that suggests continue-as-new every 120 events, a run whose trainer takes and acknowledges
    eight batches spans several runs: the numbers go on, nothing is handed out twice or lost."""
    env = await WorkflowEnvironment.start_local(
        port=free_port(),
        dev_server_existing_path=temporal_binary(),
        data_converter=pydantic_data_converter,
        search_attributes=search_attributes.ALL,
        dev_server_extra_args=fast_step_flags({SUGGEST_CONTINUE_AS_NEW: 120}),
    )
    try:
        async with staged(env, tmp_path) as stage:
            client, run = stage.client, f"door-can-{uuid.uuid4().hex[:6]}"
            feed = await client.start_workflow(
                TrainingFeedWorkflow.run,
                FeedInput(
                    env="echo_chain", group_size=GROUP_SIZE, batch_size=GROUP_SIZE, max_staleness=1, max_groups=8
                ),
                id=run,
                task_queue=stage.queue,
            )
            door = DoorClient(stage.door.url)
            taken: list[Batch] = []
            for group in range(8):
                await wait_until(lambda: _started(feed, min(group + 2, 8)), timeout_s=60)
                await finish(client, run, group, group)
                batch = await take(door, run, trainer_version=group)
                taken.append(batch)
                assert await asyncio.to_thread(batch.ack) == "acknowledged"
            done = await feed.result()
            runs = [w async for w in client.list_workflows(f"WorkflowId = '{run}'")]
    finally:
        await env.shutdown()
    assert len(runs) > 1, "the run continued as new"
    assert [b.number for b in taken] == list(range(8))
    assert [ids(b) for b in taken] == [[f"{run}/g{g}"] for g in range(8)]
    assert done.door.figures.batches_acknowledged == 8 and done.door.figures.batches_redelivered == 0
