"""RolloutTreeWorkflow: rollouts that branch, run and gathered as one tree.

It starts its roots as child TrajectoryWorkflows whose branch plan names this workflow.
A rollout at a branch point signals `branch_requested`; the tree starts the siblings it
names as children too, each a fork of the parent at that turn that copies the parent's
live workspace while the parent waits. The tree ends once every rollout in it has ended
and returns all their results, failed ones included, roots first. A batch runs one per
item when it branches, `rollouts fork` one per fork, and a training feed can run one per
group the same way (`execute_child_workflow(RolloutTreeWorkflow.run, RolloutTreeInput(...))`, or
started abandoned with `notify`, which it signals its result when it ends).

Gathered again (`resume`), it keeps every rollout that was scored, resumes the others, and
walks each rollout's recorded branch points to find the branches an earlier run started.
"""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from activities.resume import ResumeActivities, RunRef
    from temporal_rollouts.core.forks import BRANCH_REQUESTED, BranchPlan, BranchRequest, ForkSpec
    from temporal_rollouts.core.inputs import checked_input
    from temporal_rollouts.core.records import TrajectoryInput, TrajectoryResult
    from temporal_rollouts.core.trees import ROLLOUT_TREE_FINISHED, RolloutTreeInput, RolloutTreeResult, TreeNode
    from workflows import params
    from workflows.children import result_from_failure, rollout_attributes
    from workflows.trajectory import TrajectoryWorkflow


def branch_input(parent: TrajectoryInput, request: BranchRequest, group_index: int) -> TrajectoryInput:
    """A sibling of `request.parent` from its turn: the parent's own input, forked at that turn, copying its
    live slot, with the later branch points only."""
    fork = ForkSpec(
        source=request.parent,
        source_run=request.parent_run,
        at_turn=request.turn,
        prefix=request.prefix,
        copy_from=request.slot,
    )
    plan = parent.branch.after(request.turn) if parent.branch else None
    return parent.model_copy(update={"fork": fork, "branch": plan, "group_index": group_index, "resume_from_run": None})


@workflow.defn(name="RolloutTreeWorkflow")
class RolloutTreeWorkflow:
    def __init__(self) -> None:
        self._requests: list[BranchRequest] = []
        self._nodes: dict[str, TreeNode] = {}
        self._running: dict[str, asyncio.Task[TrajectoryResult]] = {}
        self._inputs: dict[str, TrajectoryInput] = {}
        self._resume = False

    @workflow.signal(name=BRANCH_REQUESTED)
    def branch_requested(self, request: BranchRequest) -> None:
        self._requests.append(request)

    @workflow.query
    def tree(self) -> list[TreeNode]:
        return list(self._nodes.values())

    @workflow.run
    @checked_input
    async def run(self, input: RolloutTreeInput) -> RolloutTreeResult:
        self._resume = input.resume
        branch = input.branch
        plan = (
            BranchPlan(
                at_turns=branch.at_turns,
                factor=branch.factor,
                tree=workflow.info().workflow_id,
                copy_wait_s=branch.copy_wait_s,
            )
            if branch
            else None
        )
        for index, root in enumerate(input.root_ids):
            self._start(root, input.rollout.model_copy(update={"branch": plan, "group_index": index}), None, None)
        try:
            while True:
                await workflow.wait_condition(lambda: bool(self._requests) or self._all_done())
                while self._requests:
                    self._start_branches(self._requests.pop(0))
                if self._all_done():
                    break
        except asyncio.CancelledError:
            for task in self._running.values():
                task.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)
            raise
        tree = RolloutTreeResult(
            results=[task.result() for task in self._running.values()], nodes=list(self._nodes.values())
        )
        if input.notify:
            await _tell(input.notify, tree)
        return tree

    def _all_done(self) -> bool:
        return all(task.done() for task in self._running.values())

    def _start_branches(self, request: BranchRequest) -> None:
        parent = self._inputs.get(request.parent)
        if parent is None:
            workflow.logger.warning("branch point of %s, which is not in this tree", request.parent)
            return
        for child in request.children:
            if child not in self._nodes:
                self._start(child, branch_input(parent, request, len(self._nodes)), request.parent, request.turn)

    def _start(self, rollout: str, input: TrajectoryInput | None, parent: str | None, turn: int | None) -> None:
        """`input` None: a branch an earlier run of the tree started (found on resume), read from its history."""
        self._nodes[rollout] = TreeNode(rollout_id=rollout, parent=parent, turn=turn)
        if input is not None:
            self._inputs[rollout] = input
        self._running[rollout] = asyncio.ensure_future(self._run_one(rollout, input))

    async def _run_one(self, rollout: str, input: TrajectoryInput | None) -> TrajectoryResult:
        resume_from = None
        if self._resume:
            outcome = await workflow.execute_activity_method(
                ResumeActivities.await_rollout, RunRef(workflow_id=rollout), **params.AWAIT_ROLLOUT.options()
            )
            if outcome.result is not None:
                self._revisit_branches(outcome.result)
                if not outcome.result.failed:
                    return outcome.result
            if outcome.status != "not_found":
                resume_from = outcome.run_id
        if input is None:
            input = await workflow.execute_activity_method(
                ResumeActivities.started_input, RunRef(workflow_id=rollout), **params.LOAD_ITEMS.options()
            )
            self._inputs[rollout] = input
        input = input.model_copy(update={"resume_from_run": resume_from})
        try:
            return await workflow.execute_child_workflow(
                TrajectoryWorkflow.run,
                input,
                id=rollout,
                task_queue=workflow.info().task_queue,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                search_attributes=rollout_attributes(input),
            )
        except ChildWorkflowError as err:
            return result_from_failure(err, rollout, input.env, input.item, input.group_index)

    def _revisit_branches(self, earlier: TrajectoryResult) -> None:
        """The branches an earlier run of `earlier` started: gathered again like the roots."""
        for record in earlier.branches:
            for child in record.children:
                if child not in self._nodes:
                    self._start(child, None, earlier.rollout_id, record.turn)


async def _tell(workflow_id: str, tree: RolloutTreeResult) -> None:
    """Signal the workflow that started this tree with its result; one that is gone is logged, not this tree's failure."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(ROLLOUT_TREE_FINISHED, tree)
    except Exception as err:  # noqa: BLE001
        workflow.logger.warning(
            "could not tell %s that tree %s ended: %s", workflow_id, workflow.info().workflow_id, err
        )
