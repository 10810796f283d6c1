"""Histories recorded before the package re-layout still replay on today's workflow code.

tests/data/histories/ holds real histories from the pre-layout tree (commit dfc88b6): a
terminal-task rollout, an echo_chain batch and one of its child rollouts, each run
through the real worker, dev server, sandbox and demo policy. Workflow and activity
names, inputs and the order of commands must stay replayable, so a running rollout
survives an upgrade of its workers. The fork_* histories are a branched batch's tree, its
parent (branching after turn 1, with turn snapshots) and its branch (a live copy), recorded
when branching landed: later changes must keep them replayable too.
"""

from __future__ import annotations

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from tests.support import REPO
from workflows.batch import BatchWorkflow
from workflows.pool import SlotPoolMaintenanceWorkflow
from workflows.trajectory import TrajectoryWorkflow
from workflows.tree import RolloutTreeWorkflow

HISTORIES = REPO / "tests" / "data" / "histories"
RECORDED_IDS = {
    "trajectory": "rollout-recorded",
    "batch": "batch-recorded",
    "batch_child": "batch-recorded/item-0/g0",
    "fork_tree": "fork-recorded/item-0/tree",
    "fork_parent": "fork-recorded/item-0/g0",
    "fork_branch": "fork-recorded/item-0/g0/t1b1",
}


@pytest.mark.parametrize("name", ["trajectory", "batch", "batch_child", "fork_tree", "fork_parent", "fork_branch"])
@pytest.mark.parametrize("runner", [UnsandboxedWorkflowRunner, SandboxedWorkflowRunner])
async def test_a_history_from_before_the_layout_replays(name: str, runner) -> None:
    history = WorkflowHistory.from_json(RECORDED_IDS[name], (HISTORIES / f"{name}.json").read_text())
    replayer = Replayer(
        workflows=[BatchWorkflow, TrajectoryWorkflow, RolloutTreeWorkflow, SlotPoolMaintenanceWorkflow],
        workflow_runner=runner(),
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
