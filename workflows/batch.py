"""BatchWorkflow: items x group size child trajectories, each item's group written to the sink.

A group is written once all of its rollouts are scored; a group with a failed rollout
is held back (`groups_pending`) until `rollouts resume` completes it, because a trainer
normalises advantages over the whole group. Progress is kept in the workflow (query
`progress`) and mirrored to search attributes. A long batch continues as new when
Temporal suggests it, so 10,000 rollouts never reach the history or pending-child limits.
Items are read a page at a time as the batch goes, and the continue-as-new cursor carries
only where it is, so a batch of a million items costs a page of items in the worker and
in history. A batch is checked before it starts: its input here, the worker's limits,
the env's size and the output path by its first two steps, whose refusal fails it. A
batch that branches (`branch`) runs each item's group as one RolloutTreeWorkflow, whose
whole tree is the group.
"""

from __future__ import annotations

import asyncio
from datetime import datetime
from typing import Any

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.envs import BatchShape, EnvActivities, LoadItemsInput, distinct_items
    from activities.resume import ResumeActivities, RolloutOutcome, RunRef
    from activities.sinks import OpenSinkInput, SinkActivities, WriteGroupInput
    from temporal_rollouts.core import search_attributes as sa
    from temporal_rollouts.core.errors import InvalidInput, as_application_error
    from temporal_rollouts.core.inputs import checked_input
    from temporal_rollouts.core.records import (
        BatchCursor,
        BatchInput,
        BatchProgress,
        BatchResult,
        TrajectoryInput,
        TrajectoryResult,
    )
    from temporal_rollouts.core.tasks import Item
    from temporal_rollouts.core.trees import RolloutTreeInput, RolloutTreeResult
    from workflows import params
    from workflows.children import result_from_failure  # noqa: F401  (the training feed imports it from here)
    from workflows.trajectory import TrajectoryWorkflow
    from workflows.tree import RolloutTreeWorkflow


ITEM_PAGE = 100
"""Items read per load_items call: a batch holds one page of items, never its whole list."""


def start_window(rate: float, group_size: int) -> tuple[float, int]:
    """Pacing at `rate` rollouts a second: (window in seconds, groups started per window). A
    window is a second, or longer when a whole group takes more than a second's share."""
    window_s = max(1.0, group_size / rate)
    return window_s, max(1, int(rate * window_s + 1e-9) // group_size)


async def _setup_step(method, arg, step: params.StepParams):
    """A step that checks the batch before it starts: its refusal is the batch's own error, not a wrapped one."""
    try:
        return await workflow.execute_activity_method(method, arg, **step.options())
    except ActivityError as err:
        cause = err.cause
        if isinstance(cause, ApplicationError) and cause.non_retryable:
            raise ApplicationError(cause.message, type=cause.type or "InvalidInput", non_retryable=True) from None
        raise


def _reap(groups: set[asyncio.Task]) -> None:
    """Drop finished groups (raising a group's error), so a long batch holds only its running groups."""
    for task in [task for task in groups if task.done()]:
        groups.discard(task)
        task.result()


def rollout_id(batch_id: str, item_index: int, group_index: int) -> str:
    return f"{batch_id}/item-{item_index}/g{group_index}"


@workflow.defn(name="BatchWorkflow")
class BatchWorkflow:
    def __init__(self) -> None:
        self._progress: BatchProgress | None = None
        self._active = 0
        self._window: tuple[datetime, int] | None = (
            None  # start_rate: when the current window began, groups started in it
        )

    @workflow.query
    def progress(self) -> BatchProgress | None:
        return self._progress

    @workflow.run
    @checked_input
    async def run(self, input: BatchInput) -> BatchResult:
        info = workflow.info()
        if input.cursor is not None and info.continued_run_id is None:
            raise as_application_error(
                InvalidInput(
                    "invalid BatchWorkflow input:\ncursor: set only by the batch itself when it continues as new; leave it out"
                )
            )
        batch_id = info.workflow_id
        page: list[Item] = []
        if input.cursor is None:
            loaded = await _setup_step(
                EnvActivities.load_items,
                LoadItemsInput(
                    env=input.env,
                    env_config=input.env_config,
                    count=min(ITEM_PAGE, input.num_items),
                    offset=input.item_offset,
                    check=BatchShape(
                        num_items=input.num_items,
                        group_size=_per_group(input),
                        policy=input.policy,
                        max_concurrency=input.max_concurrency,
                        cycle_items=input.cycle_items,
                    ),
                ),
                params.LOAD_ITEMS,
            )
            output = await _setup_step(
                SinkActivities.open_sink,
                OpenSinkInput(batch_id=batch_id, output=input.output),
                params.WRITE_GROUP,
            )
            page = loaded.items
            cursor = BatchCursor(
                next_item=0,
                allow_network=loaded.allow_network,
                progress=BatchProgress(
                    batch_id=batch_id,
                    env=input.env,
                    total=input.num_items * _per_group(input),
                    items=input.num_items,
                    distinct_items=distinct_items(loaded.item_count, input.num_items),
                    output=output,
                ),
            )
        else:
            cursor = input.cursor
        page_start = cursor.next_item
        progress = self._progress = cursor.progress
        workflow.upsert_search_attributes([sa.ENV.value_set(input.env), sa.BATCH_ID.value_set(batch_id)])

        per_group = _per_group(input)
        room = max(input.max_concurrency, per_group)
        groups: set[asyncio.Task] = set()
        try:
            while cursor.next_item < input.num_items:
                if workflow.info().is_continue_as_new_suggested():
                    break
                await workflow.wait_condition(lambda: self._active + per_group <= room)
                if input.start_rate:
                    await self._pace(input.start_rate, input.group_size)
                _reap(groups)
                index = cursor.next_item
                if index >= page_start + len(page):
                    page_start, page = index, await self._page(input, index)
                groups.add(asyncio.ensure_future(self._run_group(input, cursor, index, page[index - page_start])))
                cursor.next_item += 1
            await asyncio.gather(*groups)
        except asyncio.CancelledError:
            # Cancel the running rollouts and wait for them: each releases its slot and records
            # `cancelled`. Closing first would terminate them (parent close policy), slots held.
            for group in groups:
                group.cancel()
            await asyncio.gather(*groups, return_exceptions=True)
            raise

        if cursor.next_item < input.num_items:
            workflow.continue_as_new(input.model_copy(update={"cursor": cursor}))
        progress.done = True
        return BatchResult(
            batch_id=batch_id,
            env=input.env,
            total=progress.total,
            completed=progress.completed,
            failed=progress.failed,
            mean_score=progress.mean_score,
            stop_reasons=progress.stop_reasons,
            stop_details=progress.stop_details,
            items=progress.items,
            distinct_items=progress.distinct_items,
            output=progress.output,
            groups_written=progress.groups_written,
            groups_pending=progress.groups_pending,
            resumed=progress.resumed,
        )

    async def _pace(self, rate: float, group_size: int) -> None:
        """At most `rate` rollouts started per second, a group at a time: one timer per window
        (a second, or one group's share when the rate is below a group a second), not per start."""
        window_s, per_window = start_window(rate, group_size)
        began, started = self._window or (workflow.now(), 0)
        left = window_s - (workflow.now() - began).total_seconds()
        if left > 0 and started >= per_window:
            await workflow.sleep(left)
        if left <= 0 or started >= per_window:
            began, started = workflow.now(), 0
        self._window = (began, started + 1)

    async def _page(self, input: BatchInput, index: int) -> list[Item]:
        """The page of items that starts at batch item `index`."""
        loaded = await workflow.execute_activity_method(
            EnvActivities.load_items,
            LoadItemsInput(
                env=input.env,
                env_config=input.env_config,
                count=min(ITEM_PAGE, input.num_items - index),
                offset=input.item_offset + index,
            ),
            **params.LOAD_ITEMS.options(),
        )
        if not loaded.items:
            raise ApplicationError(
                f"env {input.env!r} returned no items at offset {input.item_offset + index}",
                type="TaskError",
                non_retryable=True,
            )
        return loaded.items

    async def _run_group(self, input: BatchInput, cursor: BatchCursor, index: int, item: Item) -> None:
        progress = cursor.progress
        if input.branch:
            results = await self._run_tree(input, cursor, index, item)
        else:
            self._active += input.group_size
            results = await asyncio.gather(
                *(self._run_rollout(input, cursor, index, item, g) for g in range(input.group_size))
            )
        written = await workflow.execute_activity_method(
            SinkActivities.write_group,
            # The name inside the results folder, not the opening worker's absolute path: the worker that
            # writes this group may be on another host, with the results folder at another place.
            WriteGroupInput(
                path=input.output or f"{progress.batch_id}.jsonl",
                group_id=f"{progress.batch_id}/item-{index}",
                results=list(results),
                sink=input.sink,
                max_token_length=input.max_token_length,
                policy=input.policy,
                **({"prefix_tokens": input.branch.prefix_tokens} if input.branch else {}),
            ),
            **params.WRITE_GROUP.options(),
        )
        if written.status == "pending":
            progress.groups_pending += 1
        else:
            progress.groups_written += 1

    async def _run_tree(self, input: BatchInput, cursor: BatchCursor, index: int, item: Item) -> list[TrajectoryResult]:
        """The item's group as one tree: its roots, and every branch they make. It is counted at its largest
        while it runs, and by what it made once it ends."""
        assert input.branch is not None
        progress, size = cursor.progress, _per_group(input)
        roots = [rollout_id(progress.batch_id, index, g) for g in range(input.group_size)]
        rollout = _rollout_input(input, cursor, item)
        self._active += size
        progress.running += input.group_size
        try:
            tree = await workflow.execute_child_workflow(
                RolloutTreeWorkflow.run,
                RolloutTreeInput(rollout=rollout, root_ids=roots, branch=input.branch, resume=input.resume),
                id=f"{progress.batch_id}/item-{index}/tree",
                task_queue=workflow.info().task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            )
            results = RolloutTreeResult.model_validate(tree).results
        except ChildWorkflowError as err:
            results = [result_from_failure(err, root, input.env, item, g) for g, root in enumerate(roots)]
        finally:
            progress.running -= input.group_size
            self._active -= size
        progress.total += len(results) - size
        return [self._record(result) for result in results]

    async def _run_rollout(
        self, input: BatchInput, cursor: BatchCursor, index: int, item: Item, group_index: int
    ) -> TrajectoryResult:
        progress = cursor.progress
        rollout = rollout_id(progress.batch_id, index, group_index)
        progress.running += 1
        try:
            resume_from = None
            if input.resume:
                outcome = await self._outcome(rollout)
                if outcome.result is not None and not outcome.result.failed:
                    return self._record(outcome.result)
                if outcome.status != "not_found":
                    resume_from = outcome.run_id
                    progress.resumed += 1
            try:
                result = await workflow.execute_child_workflow(
                    TrajectoryWorkflow.run,
                    _rollout_input(input, cursor, item, group_index=group_index, resume_from_run=resume_from),
                    id=rollout,
                    task_queue=workflow.info().task_queue,
                    id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                    search_attributes=TypedSearchAttributes(
                        [
                            SearchAttributePair(sa.ENV, input.env),
                            SearchAttributePair(sa.BATCH_ID, progress.batch_id),
                            SearchAttributePair(sa.ITEM_ID, item.id),
                        ]
                    ),
                )
            except ChildWorkflowError as err:
                result = result_from_failure(err, rollout, input.env, item, group_index)
            return self._record(result)
        finally:
            progress.running -= 1
            self._active -= 1

    async def _outcome(self, rollout: str) -> RolloutOutcome:
        """An earlier run's outcome; waits for one that is still running (resumed elsewhere)."""
        outcome = await workflow.execute_activity_method(
            ResumeActivities.rollout_outcome, RunRef(workflow_id=rollout), **params.LOAD_ITEMS.options()
        )
        if outcome.status == "running":
            outcome = await workflow.execute_activity_method(
                ResumeActivities.await_rollout, RunRef(workflow_id=rollout), **params.AWAIT_ROLLOUT.options()
            )
        return outcome

    def _record(self, result: TrajectoryResult) -> TrajectoryResult:
        progress = self._progress
        assert progress is not None
        progress.count(result)
        workflow.upsert_search_attributes([sa.COMPLETED.value_set(progress.completed + progress.failed)])
        return result


def _rollout_input(input: BatchInput, cursor: BatchCursor, item: Item, **fields: Any) -> TrajectoryInput:
    """A rollout of `item` as the batch runs it (the root of a tree, or one rollout of its group: `fields`)."""
    return TrajectoryInput(
        env=input.env,
        item=item,
        env_config=input.env_config,
        policy=input.policy,
        tool_call_parser=input.tool_call_parser,
        allow_network=cursor.allow_network,
        limits=input.limits,
        sampling=input.sampling,
        batch_id=cursor.progress.batch_id,
        snapshot_turns=input.snapshot_turns,
        **fields,
    )


def _per_group(input: BatchInput) -> int:
    """Rollouts of one item at most: the group, or the whole tree when the batch branches."""
    return input.branch.tree_size(input.group_size) if input.branch else input.group_size
