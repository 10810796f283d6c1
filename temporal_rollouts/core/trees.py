"""The input and result of a RolloutTreeWorkflow: rollouts that branch, gathered as one tree.

A batch with `branch` set runs one tree per item, and `rollouts fork` one per fork; a
training feed can start one the same way (a child workflow that returns every rollout of
the tree, failed ones included, for one scored group).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from temporal_rollouts.core.forks import BranchSpec
from temporal_rollouts.core.records import TrajectoryInput, TrajectoryResult


ROLLOUT_TREE_FINISHED = "rollout_tree_finished"
"""The signal a tree started with `notify` sends that workflow when it ends, carrying its RolloutTreeResult."""


class RolloutTreeInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    rollout: TrajectoryInput = Field(description="What every root runs (a fork's roots carry `fork`).")
    root_ids: list[str] = Field(
        min_length=1, description="Workflow ids of the roots; their branches are named after them."
    )
    branch: BranchSpec | None = Field(default=None, description="Where the roots and their branches branch.")
    resume: bool = Field(
        default=False, description="Gather an earlier run again: keep scored rollouts, resume failed ones."
    )
    notify: str | None = Field(
        default=None,
        description="Workflow id told when the tree ends (signal `rollout_tree_finished`, with the "
        "RolloutTreeResult): a training feed that does not wait on its children.",
    )


class TreeNode(BaseModel):
    rollout_id: str
    parent: str | None = None
    turn: int | None = Field(default=None, description="The parent's turn this rollout branched after.")


class RolloutTreeResult(BaseModel):
    results: list[TrajectoryResult] = Field(description="Roots first, then branches in the order they started.")
    nodes: list[TreeNode]
