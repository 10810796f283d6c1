"""Forks after the fact and live branches, through the real worker, dev server, sandbox and demo policy.

echo_chain is the witness: its verifier scores 1.0 only when chain.log holds every step once
and in order, so a continuation scores only if its workspace was exactly the source's after
turn K (steps 1..K) and it ran steps K+1.. itself; the demo policy's counters show which
turns the model was asked for, so a prefix generated again would show.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from temporalio.client import Client

from temporal_rollouts.client.forks import find_fork_point, start_fork
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.forks import BranchPlan, BranchSpec, ForkSpec
from temporal_rollouts.core.records import BatchInput, StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.core.trees import ROLLOUT_TREE_FINISHED, RolloutTreeInput, RolloutTreeResult
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotRef
from temporal_rollouts.sinks.jsonl import read_groups
from temporal_rollouts.storage.transcripts import TranscriptStore
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import batch_id, leased_slots, no_leases, wait_until
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow
from workflows.tree import RolloutTreeWorkflow

STEPS = 4


async def source_rollout(client: Client, settings: Settings, **fields) -> TrajectoryResult:
    env_config = {"steps": STEPS, **fields.pop("env_config", {})}
    return TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(
                env="echo_chain", item=Item(id=f"echo-{uuid.uuid4().int % 10**6}"), env_config=env_config, **fields
            ),
            id=f"source-{uuid.uuid4().hex[:6]}",
            task_queue=settings.temporal.task_queue,
        )
    )


async def fork_of(
    client: Client, settings: Settings, source: str, at_turn: int, count: int, **options
) -> RolloutTreeResult:
    handle, _, _ = await start_fork(client, settings, source, at_turn, count, **options)
    return RolloutTreeResult.model_validate(await handle.result())


def requested_turns(demo_policy: DemoPolicyProcess) -> list[int]:
    return sorted(t for turns in demo_policy.stats()["conversations"].values() for t in turns)


async def test_a_fork_takes_over_the_first_turns_and_rebuilds_the_workspace_by_replay(
    client: Client,
    settings: Settings,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
    transcripts: TranscriptStore,
) -> None:
    source = await source_rollout(client, settings)
    assert source.score == 1.0 and source.turns == STEPS + 1
    demo_policy.reset()

    tree = await fork_of(client, settings, source.rollout_id, 2, 3)

    assert [r.score for r in tree.results] == [1.0, 1.0, 1.0], [r.stop_detail for r in tree.results]
    root, *siblings = tree.results
    assert root.fork and root.fork.parent == source.rollout_id and root.fork.workspace == "replay"
    assert root.fork.replayed_calls == 2 and not root.fork.divergences
    assert all(s.fork and s.fork.parent == root.rollout_id and s.fork.workspace == "copy" for s in siblings)
    assert all(r.turns == STEPS + 1 and r.tool_calls == STEPS for r in tree.results)
    assert requested_turns(demo_policy) == sorted([2, 3, 4] * 3), "turns 1 and 2 were not asked for again"
    prefix = await transcripts.cut(source.transcript, 2)
    for result in tree.results:
        assert (await transcripts.cut(result.transcript, 2)).head == prefix.head, "the prefix is the source's own chain"
        assert result.completion_tokens < source.completion_tokens
    found = {e.id async for e in client.list_workflows(f"RolloutForkedFrom = '{source.rollout_id}'")}
    assert found == {root.rollout_id}
    described = await client.get_workflow_handle(siblings[0].rollout_id).describe()
    assert described.typed_search_attributes.get(sa.FORK_TURN) == 2
    assert await leased_slots(pool) == []


async def test_a_fork_restores_the_snapshot_of_its_turn_when_the_source_kept_them(
    client: Client,
    settings: Settings,
    demo_policy: DemoPolicyProcess,
) -> None:
    source = await source_rollout(client, settings, snapshot_turns=True)
    tree = await fork_of(client, settings, source.rollout_id, 3, 1)
    (result,) = tree.results
    assert (
        result.score == 1.0 and result.fork and result.fork.workspace == "snapshot" and result.fork.replayed_calls == 0
    )


async def test_a_replay_that_answers_differently_stops_before_the_model_runs_unless_allowed(
    client: Client,
    settings: Settings,
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    source = await source_rollout(client, settings, env_config={"stamp": True})
    demo_policy.reset()

    (diverged,) = (await fork_of(client, settings, source.rollout_id, 2, 1)).results
    assert diverged.stop_reason is StopReason.FORK_DIVERGED and diverged.fork
    assert [d.turn for d in diverged.fork.divergences] == [1, 2] and "allow_divergence" in diverged.stop_detail
    assert demo_policy.stats()["total"] == 0, "the model was not asked for anything"
    with_divergence = await fork_of(client, settings, source.rollout_id, 2, 2, allow_divergence=True)
    assert [r.score for r in with_divergence.results] == [1.0, 1.0]
    assert await leased_slots(pool) == []


async def test_a_batch_branches_live_and_its_group_carries_the_tree(
    client: Client,
    settings: Settings,
    pool: SandboxPool,
    transcripts: TranscriptStore,
) -> None:
    batch = BatchInput(
        env="echo_chain",
        env_config={"steps": STEPS},
        num_items=1,
        group_size=2,
        branch={"at_turns": [1, 3], "factor": 2},
    )
    result = await client.execute_workflow(
        BatchWorkflow.run, batch, id=batch_id("branch"), task_queue=settings.temporal.task_queue
    )

    assert result.completed == 8 and result.failed == 0 and result.total == 8, result
    (group,) = read_groups(Path(result.output))
    assert group["scores"] == [1.0] * 8
    nodes = {o["rollout_id"]: o for o in group["overrides"]}
    roots = [r for r, o in nodes.items() if o["parent"] is None]
    assert len(roots) == 2 and sorted(o["branch_turn"] for o in nodes.values() if o["parent"]) == [1, 1, 3, 3, 3, 3]
    assert all(o["parent"] in nodes for o in nodes.values() if o["parent"])
    points = group["group_overrides"]["tree"]["branch_points"]
    assert len(points) == 6 and group["group_overrides"]["tree"]["prefix_tokens"] == "once"
    children = [
        TrajectoryResult.model_validate(await client.get_workflow_handle(r).result())
        for r, o in nodes.items()
        if o["parent"]
    ]
    assert all(c.fork and c.fork.workspace == "copy" for c in children)
    for child in children:
        parent = TrajectoryResult.model_validate(await client.get_workflow_handle(child.fork.parent).result())
        turn = child.fork.at_turn
        assert (await transcripts.cut(child.transcript, turn)).head == (
            await transcripts.cut(parent.transcript, turn)
        ).head
    assert await leased_slots(pool) == []


async def test_a_fork_of_a_turn_the_rollout_never_reached_is_refused(client: Client, settings: Settings) -> None:
    source = await source_rollout(client, settings)
    try:
        await start_fork(client, settings, source.rollout_id, STEPS + 3, 2)
    except Exception as err:  # noqa: BLE001
        assert "fork at a turn from 0 to 5" in str(err)
    else:
        raise AssertionError("a fork past the last turn started")


async def test_a_branch_that_cannot_copy_its_parent_restores_the_turn_snapshot_or_replays(
    client: Client,
    settings: Settings,
    pool: SandboxPool,
) -> None:
    """A branch whose parent's slot is gone (the parent stopped waiting and released it) falls back."""
    for kept in (True, False):
        source = await source_rollout(client, settings, snapshot_turns=kept)
        point = await find_fork_point(client, settings, source.rollout_id, 2)
        container = (await pool.fleet.refresh())[0].container_id
        gone = SlotRef(container_id=container, slot=0, lease_id="released-long-ago")
        fork = ForkSpec(
            source=source.rollout_id, source_run=point.source_run, at_turn=2, prefix=point.prefix, copy_from=gone
        )
        result = TrajectoryResult.model_validate(
            await client.execute_workflow(
                TrajectoryWorkflow.run,
                TrajectoryInput(env="echo_chain", item=Item(id=source.item_id), env_config={"steps": STEPS}, fork=fork),
                id=f"late-{uuid.uuid4().hex[:6]}",
                task_queue=settings.temporal.task_queue,
            )
        )
        assert result.score == 1.0 and result.fork
        assert result.fork.workspace == ("snapshot" if kept else "replay")


async def test_a_parent_that_waits_too_long_saves_its_workspace_for_the_late_branches(
    client: Client,
    settings: Settings,
    pool: SandboxPool,
) -> None:
    """The parent's tree here is a rollout that never starts branches (it sits in setup), so the parent
    waits out copy_wait_s, saves its workspace and goes on; a branch that comes later restores that."""
    queue = settings.temporal.task_queue
    idle = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="echo_chain", item=Item(id="echo-5"), env_config={"setup_sleep_s": 60}),
        id=f"idle-tree-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
    )
    try:
        parent = await source_rollout(
            client, settings, branch=BranchPlan(at_turns=[2], factor=2, tree=idle.id, copy_wait_s=1.0)
        )
    finally:
        await idle.cancel()
    (record,) = parent.branches
    assert parent.score == 1.0 and record.snapshot and record.copied == []
    point = await find_fork_point(client, settings, parent.rollout_id, 2)
    container = (await pool.fleet.refresh())[0].container_id
    fork = ForkSpec(
        source=parent.rollout_id,
        source_run=point.source_run,
        at_turn=2,
        prefix=point.prefix,
        copy_from=SlotRef(container_id=container, slot=0, lease_id="the-parents-lease-is-gone"),
    )
    late = TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(env="echo_chain", item=Item(id=parent.item_id), env_config={"steps": STEPS}, fork=fork),
            id=record.children[0],
            task_queue=queue,
        )
    )
    assert late.score == 1.0 and late.fork and late.fork.workspace == "snapshot"
    await wait_until(lambda: no_leases(pool), timeout_s=15)


async def test_a_tree_started_with_notify_signals_its_result_to_that_workflow(
    client: Client, settings: Settings
) -> None:
    """How a training feed that does not wait on its children learns that a tree ended."""
    queue = settings.temporal.task_queue
    feed = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="echo_chain", item=Item(id="echo-6"), env_config={"setup_sleep_s": 60}),
        id=f"feed-stand-in-{uuid.uuid4().hex[:6]}",
        task_queue=queue,
    )
    try:
        rollout = TrajectoryInput(env="echo_chain", item=Item(id="echo-7"), env_config={"steps": 2})
        tree = RolloutTreeResult.model_validate(
            await client.execute_workflow(
                RolloutTreeWorkflow.run,
                RolloutTreeInput(
                    rollout=rollout,
                    root_ids=[f"notified-{uuid.uuid4().hex[:6]}"],
                    notify=feed.id,
                    branch=BranchSpec(at_turns=[1], factor=2),
                ),
                id=f"tree-{uuid.uuid4().hex[:6]}",
                task_queue=queue,
            )
        )
        assert [r.score for r in tree.results] == [1.0, 1.0]
        history = await feed.fetch_history()
        signals = [
            e.workflow_execution_signaled_event_attributes.signal_name
            for e in history.events
            if e.HasField("workflow_execution_signaled_event_attributes")
        ]
        assert signals == [ROLLOUT_TREE_FINISHED]
    finally:
        await feed.cancel()
