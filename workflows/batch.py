"""BatchWorkflow: items x group size child trajectories, each item's group written to the sink.

Progress is kept in the workflow (query `progress`) and mirrored to search attributes,
so the CLI and the Temporal UI both show it.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import TypedSearchAttributes
from temporalio.exceptions import ApplicationError, CancelledError, ChildWorkflowError, TerminatedError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from activities.envs import EnvActivities, LoadItemsInput
    from activities.sinks import OpenSinkInput, SinkActivities, WriteGroupInput
    from envs.base import Item
    from rollouts import search_attributes as sa
    from rollouts.records import BatchInput, BatchProgress, BatchResult, StopReason, TrajectoryInput, TrajectoryResult
    from workflows import params
    from workflows.trajectory import TrajectoryWorkflow


def rollout_id(batch_id: str, item_index: int, group_index: int) -> str:
    return f"{batch_id}/item-{item_index}/g{group_index}"


def result_from_failure(err: ChildWorkflowError, rollout: str, env: str, item: Item, group_index: int) -> TrajectoryResult:
    """A failed child's TrajectoryResult: carried in its failure, or rebuilt from how it ended."""
    cause = err.cause
    if isinstance(cause, ApplicationError) and cause.type == "RolloutFailed" and cause.details:
        return TrajectoryResult.model_validate(cause.details[0])
    if isinstance(cause, TerminatedError):
        reason = StopReason.TERMINATED
    elif isinstance(cause, CancelledError):
        reason = StopReason.CANCELLED
    elif isinstance(cause, TimeoutError):
        reason = StopReason.TIMED_OUT
    else:
        reason = StopReason.ENV_ERROR
    return TrajectoryResult(
        rollout_id=rollout, env=env, item_id=item.id, group_index=group_index,
        stop_reason=reason, stop_detail=str(cause or err),
    )


@workflow.defn(name="BatchWorkflow")
class BatchWorkflow:
    def __init__(self) -> None:
        self._progress: BatchProgress | None = None

    @workflow.query
    def progress(self) -> BatchProgress | None:
        return self._progress

    @workflow.run
    async def run(self, input: BatchInput) -> BatchResult:
        info = workflow.info()
        batch_id = info.workflow_id
        loaded = await workflow.execute_activity_method(
            EnvActivities.load_items,
            LoadItemsInput(env=input.env, env_config=input.env_config, count=input.num_items, offset=input.item_offset),
            **params.LOAD_ITEMS.options(),
        )
        output = await workflow.execute_activity_method(
            SinkActivities.open_sink, OpenSinkInput(batch_id=batch_id, output=input.output), **params.WRITE_GROUP.options()
        )
        progress = self._progress = BatchProgress(
            batch_id=batch_id, env=input.env, total=len(loaded.items) * input.group_size, output=output
        )
        workflow.upsert_search_attributes([sa.ENV.value_set(input.env), sa.BATCH_ID.value_set(batch_id)])
        slots = asyncio.Semaphore(input.max_concurrency)

        async def run_rollout(index: int, item: Item, group_index: int) -> TrajectoryResult:
            rollout = rollout_id(batch_id, index, group_index)
            async with slots:
                progress.running += 1
                try:
                    result = await workflow.execute_child_workflow(
                        TrajectoryWorkflow.run,
                        TrajectoryInput(
                            env=input.env, item=item, env_config=input.env_config, policy=input.policy,
                            allow_network=loaded.allow_network, limits=input.limits, sampling=input.sampling,
                            batch_id=batch_id, group_index=group_index,
                        ),
                        id=rollout,
                        task_queue=info.task_queue,
                        search_attributes=TypedSearchAttributes([
                            sa.ENV.value_set(input.env), sa.BATCH_ID.value_set(batch_id), sa.ITEM_ID.value_set(item.id),
                        ]),
                    )
                except ChildWorkflowError as err:
                    result = result_from_failure(err, rollout, input.env, item, group_index)
                finally:
                    progress.running -= 1
            self._record(result)
            return result

        async def run_group(index: int, item: Item) -> None:
            results = await asyncio.gather(*(run_rollout(index, item, g) for g in range(input.group_size)))
            written = await workflow.execute_activity_method(
                SinkActivities.write_group,
                WriteGroupInput(path=output, group_id=f"{batch_id}/item-{index}", results=list(results)),
                **params.WRITE_GROUP.options(),
            )
            if written.written:
                progress.groups_written += 1

        await asyncio.gather(*(run_group(i, item) for i, item in enumerate(loaded.items)))
        progress.done = True
        return BatchResult(
            batch_id=batch_id, env=input.env, total=progress.total, completed=progress.completed,
            failed=progress.failed, mean_score=progress.mean_score, stop_reasons=progress.stop_reasons,
            output=output, groups_written=progress.groups_written,
        )

    def _record(self, result: TrajectoryResult) -> None:
        progress = self._progress
        assert progress is not None
        if result.failed:
            progress.failed += 1
        else:
            progress.completed += 1
            progress.score_sum += result.score
        reason = result.stop_reason.value
        progress.stop_reasons[reason] = progress.stop_reasons.get(reason, 0) + 1
        workflow.upsert_search_attributes([sa.COMPLETED.value_set(progress.completed + progress.failed)])
