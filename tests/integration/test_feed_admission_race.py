"""The training feed's admission against a run-api whose answers arrive late, on the real dev server.

The feed asks run-api how many of its groups wait there while it also posts groups: a long-poll
answer read before a post landed, taken as read, lets a second batch of the run queue in run-api,
which hands out the newest first, so the older one reaches the trainer a step staler than the bound
(the way `test_a_trainer_slower_than_its_rollouts_...` once failed in CI, by chance). Here the order
is forced: run-api, the rollouts and the trainer are in the test's hands (run-api as a stand-in of
the feed's own activities, counting what the real one counts), the workflow is the real one.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.envs import LoadedItems, LoadItemsInput
from activities.feed import FeedCheck, FeedCheckInput, FeedGroupInput, FeedGroupOutcome, RunsToCheck, TrainerQuery
from temporal_rollouts.core.feed import FeedInput, FeedStatus, TrainerView
from temporal_rollouts.core.records import StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.tasks import Item
from tests.support.waiting import wait_until
from workflows.feed import TrainingFeedWorkflow

GROUP_SIZE = 2


@workflow.defn(name="TrajectoryWorkflow")
class HeldRollout:
    """A rollout that ends, scored, when the test signals `finish`."""

    def __init__(self) -> None:
        self._finish = False

    @workflow.signal
    def finish(self) -> None:
        self._finish = True

    @workflow.run
    async def run(self, input: TrajectoryInput) -> TrajectoryResult:
        await workflow.wait_condition(lambda: self._finish)
        return TrajectoryResult(
            rollout_id=workflow.info().workflow_id,
            env=input.env,
            item_id=input.item.id,
            group_index=input.group_index,
            stop_reason=StopReason.COMPLETED,
        )


class SlowRunApi:
    """run-api as the feed's activities see it: a step, a queue of this run's groups (handed out newest
    first, as run-api does), and a long-poll view whose answer the test can hold after it was read."""

    def __init__(self) -> None:
        self.step = 0
        self.queue: list[str] = []
        self.most_queued = 0
        self.posted: list[str] = []
        self.deliver = asyncio.Event()
        self.deliver.set()
        self.waits_asked = 0
        self.waiting_views_read: list[TrainerView] = []
        """What each long poll read, in order."""

    def pull(self) -> str:
        self.step += 1
        return self.queue.pop()

    def _view(self) -> TrainerView:
        return TrainerView(
            registered=True, current_step=self.step, batch_size=GROUP_SIZE, env_id=0, queued=len(self.queue)
        )

    @activity.defn(name="check_feed")
    async def check_feed(self, input: FeedCheckInput) -> FeedCheck:
        return FeedCheck(allow_network=False, item_count=None, api_url="http://run-api.invalid")

    @activity.defn(name="load_items")
    async def load_items(self, input: LoadItemsInput) -> LoadedItems:
        items = [Item(id=f"item-{input.offset + k}") for k in range(input.count)]
        return LoadedItems(items=items, allow_network=False)

    @activity.defn(name="trainer_view")
    async def trainer_view(self, query: TrainerQuery) -> TrainerView:
        if query.wait_s <= 0:
            return self._view()
        self.waits_asked += 1
        deadline = asyncio.get_running_loop().time() + min(query.wait_s, 10)
        while self.step <= (query.after_step or 0) and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
        view = self._view()  # read now, answered when the test lets it
        self.waiting_views_read.append(view)
        await self.deliver.wait()
        return view

    @activity.defn(name="post_feed_group")
    async def post_feed_group(self, input: FeedGroupInput) -> FeedGroupOutcome:
        self.queue.append(input.group_id)
        self.posted.append(input.group_id)
        self.most_queued = max(self.most_queued, len(self.queue))
        return FeedGroupOutcome(status="posted", staleness=0, tokens_posted=1)

    @activity.defn(name="check_feed_rollouts")
    async def check_feed_rollouts(self, input: RunsToCheck) -> list[TrajectoryResult]:
        return []


@pytest.fixture
async def run_api(temporal_env: WorkflowEnvironment) -> AsyncIterator[tuple[Client, str, SlowRunApi]]:
    api = SlowRunApi()
    queue = f"feed-race-{uuid.uuid4().hex[:6]}"
    activities = [api.check_feed, api.load_items, api.trainer_view, api.post_feed_group, api.check_feed_rollouts]
    async with Worker(
        temporal_env.client,
        task_queue=queue,
        workflows=[TrainingFeedWorkflow, HeldRollout],
        activities=activities,
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        yield temporal_env.client, queue, api
        api.deliver.set()


async def status(feed: WorkflowHandle) -> FeedStatus:
    return FeedStatus.model_validate(await feed.query(TrainingFeedWorkflow.status))


async def finish_group(client: Client, run: str, group: int) -> None:
    """Finish a group's rollouts, waiting for each to exist: the feed counts a group as started before
    its rollouts' starts reach the server, so a query may already count one whose rollouts are not yet there."""
    for index in range(GROUP_SIZE):
        handle = client.get_workflow_handle(f"{run}/g{group}/r{index}")

        async def signalled() -> bool:
            try:
                await handle.signal(HeldRollout.finish)
            except RPCError as error:
                if error.status != RPCStatusCode.NOT_FOUND:
                    raise
                return False
            return True

        await wait_until(signalled)


async def test_a_queue_read_before_a_post_never_lets_a_second_batch_queue_in_run_api(run_api) -> None:
    client, queue, api = run_api
    run = f"feed-race-{uuid.uuid4().hex[:6]}"
    feed = await client.start_workflow(
        TrainingFeedWorkflow.run,
        FeedInput(
            env="echo_chain",
            group_size=GROUP_SIZE,
            max_staleness=2,
            max_groups=5,
            sink="atropos",
            api_url="http://x.invalid",
        ),
        id=run,
        task_queue=queue,
    )

    async def started(n: int) -> bool:
        now = await status(feed)
        return now.figures.groups_started == n and not now.admitted

    def queued(*groups: int) -> bool:
        return api.queue == [f"{run}/g{g}" for g in groups]

    # One batch a step, staleness 2: three groups in flight, and the feed long-polls for the trainer.
    await wait_until(lambda: started(3))
    await finish_group(client, run, 0)
    await wait_until(lambda: queued(0))
    # The trainer takes g0; the long poll reads an empty queue and its answer is held back.
    api.deliver.clear()
    assert api.pull() == f"{run}/g0"
    await wait_until(lambda: any(view.current_step == 1 for view in api.waiting_views_read))
    await asyncio.sleep(1.2)  # older than the feed's view age: the next loop asks run-api afresh
    await finish_group(client, run, 1)
    await wait_until(lambda: started(4))
    await asyncio.sleep(1.2)
    await finish_group(client, run, 2)  # g1 goes to run-api; g2 must wait behind it
    await wait_until(lambda: queued(1))
    asked = api.waits_asked
    api.deliver.set()  # the stale answer (an empty queue) arrives after g1's post
    # the feed took it, and either posted g2 or waits for the trainer again
    await wait_until(lambda: api.waits_asked > asked or len(api.queue) > 1)
    assert api.queue == [f"{run}/g1"], "a second batch of the run queued behind the first"

    finished = 3
    while (now := await status(feed)).phase != "done":  # the trainer steps, the rest drains
        if api.queue:
            api.pull()
        for group in range(finished, now.figures.groups_started):
            await finish_group(client, run, group)
        finished = now.figures.groups_started
        await asyncio.sleep(0.2)
    assert api.most_queued == 1
    assert sorted(api.posted) == [f"{run}/g{g}" for g in range(5)]
