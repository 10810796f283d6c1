"""Recorded histories replay on today's workflow code, sandboxed and not.

tests/data/histories/ holds real runs through the real worker, dev server, sandbox and demo
policy, recorded by `python -m tests.support.record_histories`: a terminal-task rollout, an
echo_chain batch and one of its child rollouts, and a branched batch's tree, its parent
(branching after turn 1, with turn snapshots) and its branch (a live copy). A change that
fails this test changes what a workflow does with a history it wrote: worker versioning keeps
the runs in flight on the build they started on (docs/upgrades.md), so re-record the
histories when that is meant, and look again when it is not.
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
RECORDED_IDS = {  # as tests/support/record_histories.py names them
    "trajectory": "rollout-recorded",
    "batch": "batch-recorded",
    "batch_child": "batch-recorded/item-0/g0",
    "fork_tree": "fork-recorded/item-0/tree",
    "fork_parent": "fork-recorded/item-0/g0",
    "fork_branch": "fork-recorded/item-0/g0/t1b1",
}


@pytest.mark.parametrize("name", ["trajectory", "batch", "batch_child", "fork_tree", "fork_parent", "fork_branch"])
@pytest.mark.parametrize("runner", [UnsandboxedWorkflowRunner, SandboxedWorkflowRunner])
async def test_a_recorded_history_replays(name: str, runner) -> None:
    history = WorkflowHistory.from_json(RECORDED_IDS[name], (HISTORIES / f"{name}.json").read_text())
    replayer = Replayer(
        workflows=[BatchWorkflow, TrajectoryWorkflow, RolloutTreeWorkflow, SlotPoolMaintenanceWorkflow],
        workflow_runner=runner(),
        data_converter=pydantic_data_converter,
    )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert result.replay_failure is None, result.replay_failure
