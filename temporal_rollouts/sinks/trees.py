"""A group that is a tree of rollouts: who branched from whom, and which prefix tokens are trained.

Each rollout's entry of `overrides` (kept by run-api) names its parent, the parent's turn it
branched after and the length of the prefix it shares with that parent, so a trainer can
form advantages per branch point: siblings are the rollouts with the same parent and turn,
plus the parent itself, which went on as sibling 0. `group_overrides["tree"]` lists the
branch points.

Siblings' token sequences share their prefix exactly (a branch's trace is its parent's
trace at that turn, extended). With `prefix_tokens = "once"` (the default) the prefix is
trained in the parent only and masked (-100) in every branch, so each generated token of
the group is trained once; `every_branch` leaves every sequence whole (plain GRPO over the
tree's rollouts, where the prefix gets the sum of its siblings' advantages). Only the
generated tokens of a token trace are masked; a rollout without one has nothing to mask.
"""

from __future__ import annotations

from typing import Any

from temporal_rollouts.core.forks import PrefixTokens
from temporal_rollouts.core.records import TrajectoryResult
from temporal_rollouts.core.token_trace import IGNORE_INDEX


def is_tree(results: list[TrajectoryResult]) -> bool:
    return any(r.fork is not None or r.branches for r in results)


def masked_prefix(results: list[TrajectoryResult], prefix_tokens: PrefixTokens | None) -> list[int]:
    """Per rollout, how many leading tokens are masked: a branch whose parent is in the group, under `once`."""
    if prefix_tokens != "once":
        return [0] * len(results)
    members = {r.rollout_id for r in results}
    return [r.fork.prefix_tokens if r.fork is not None and r.fork.parent in members else 0 for r in results]


def mask_prefix(masks: list[int], count: int) -> list[int]:
    return [IGNORE_INDEX] * min(count, len(masks)) + masks[count:]


def rollout_tree_fields(result: TrajectoryResult, masked: int) -> dict[str, Any]:
    fork = result.fork
    return {
        "parent": fork.parent if fork else None,
        "branch_turn": fork.at_turn if fork else None,
        "prefix_tokens": fork.prefix_tokens if fork else 0,
        "prefix_masked": masked > 0,
    }


def tree_summary(results: list[TrajectoryResult], prefix_tokens: PrefixTokens | None) -> dict[str, Any]:
    points = [{"rollout_id": r.rollout_id, "turn": b.turn, "children": b.children} for r in results for b in r.branches]
    return {"prefix_tokens": prefix_tokens or "every_branch", "branch_points": points}
