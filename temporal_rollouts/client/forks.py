"""Forks: N continuations of a rollout from its turn K, found and started (`rollouts fork`).

The continuations begin with the rollout's first K turns by reference (the same messages,
token ids and logprobs: nothing is generated again) and its workspace as it was after
turn K, then run as ordinary rollouts and are scored. They run as one RolloutTreeWorkflow:
the first continuation rebuilds the workspace (a snapshot of turn K if one was taken, else
a replay of the recorded tool calls compared with what they answered then) and the others
copy it from there. `describe_plan` says, before anything starts, what is reused, how the
workspace will be rebuilt and what cannot be carried.
"""

from __future__ import annotations

import uuid
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.fork_points import ForkPoint, ForkPointInput, ForkPoints
from activities.resume import run_input
from temporal_rollouts.client.records import id_taken
from temporal_rollouts.core import defaults
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.forks import (
    MAX_BRANCH_FACTOR,
    NOT_CARRIED,
    BranchSpec,
    ForkSpec,
    WorkspaceRebuild,
    branch_id,
)
from temporal_rollouts.core.records import TrajectoryInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.trees import RolloutTreeInput
from temporal_rollouts.runtime.registration import add_missing_search_attributes
from temporal_rollouts.storage.objects import object_client
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import TranscriptStore


async def find_fork_point(client: Client, settings: Settings, rollout: str, at_turn: int) -> ForkPoint:
    """The state after turn K, found the way the fork's own first step finds it."""
    objects = object_client(settings)
    bucket = settings.storage.bucket
    points = ForkPoints(client, TranscriptStore(objects, bucket), TokenTraceStore(objects, bucket), objects, bucket)
    return await points.find(ForkPointInput(source=rollout, at_turn=at_turn))


def fork_input(
    source: TrajectoryInput,
    rollout: str,
    point: ForkPoint,
    at_turn: int,
    *,
    policy: str | None = None,
    temperature: float | None = None,
    rebuild: WorkspaceRebuild = defaults.FORK_REBUILD,
    allow_divergence: bool = False,
) -> TrajectoryInput:
    """The source's own input, forked at `at_turn`, with another policy or temperature if asked; a fork
    belongs to no batch and tells no training feed."""
    sampling = (
        source.sampling if temperature is None else source.sampling.model_copy(update={"temperature": temperature})
    )
    fork = ForkSpec(
        source=rollout, source_run=point.source_run, at_turn=at_turn, rebuild=rebuild, allow_divergence=allow_divergence
    )
    return source.model_copy(
        update={
            "fork": fork,
            "policy": policy or source.policy,
            "sampling": sampling,
            "batch_id": None,
            "group_index": 0,
            "resume_from_run": None,
            "notify": None,
            "branch": None,
        }
    )


async def start_fork(
    client: Client,
    settings: Settings,
    rollout: str,
    at_turn: int,
    count: int,
    *,
    fork_id: str | None = None,
    point: ForkPoint | None = None,
    **options: Any,
) -> tuple[WorkflowHandle, ForkPoint, list[str]]:
    """Start the fork's tree; (its handle, the fork point, the id of every continuation: the first, which
    rebuilds the workspace, then the branches that copy it, named as the tree names them)."""
    from workflows.tree import RolloutTreeWorkflow

    if not 1 <= count <= MAX_BRANCH_FACTOR:
        raise ConfigError(f"-n: between 1 and {MAX_BRANCH_FACTOR} continuations, not {count}")
    if options.get("policy"):
        settings.policy_endpoint(options["policy"])  # an unknown name is refused here, naming the known ones
    point = point or await find_fork_point(client, settings, rollout, at_turn)
    source = await run_input(client, rollout, point.source_run, TrajectoryInput)
    tree_id = fork_id or f"{rollout}/fork-{uuid.uuid4().hex[:6]}"
    root = f"{tree_id}/n0"
    tree = RolloutTreeInput(
        rollout=fork_input(source, rollout, point, at_turn, **options),
        root_ids=[root],
        branch=BranchSpec(at_turns=[at_turn], factor=count) if count > 1 else None,
    )
    await add_missing_search_attributes(client, settings.temporal.namespace)
    try:
        handle = await client.start_workflow(
            RolloutTreeWorkflow.run,
            tree,
            id=tree_id,
            task_queue=settings.temporal.task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
        )
    except WorkflowAlreadyStartedError:
        raise await id_taken(client, tree_id) from None
    branches = [branch_id(root, at_turn, index) for index in range(1, count)]
    return handle, point, [root, *branches]


def describe_plan(
    rollout: str, at_turn: int, count: int, point: ForkPoint, rebuild: WorkspaceRebuild
) -> dict[str, Any]:
    prefix = point.prefix
    snapshot = point.snapshot if rebuild != "replay" else None
    if snapshot:
        workspace = f"restored from the snapshot taken after turn {at_turn}"
    else:
        workspace = (
            f"rebuilt by replaying {prefix.tool_calls} recorded tool call(s) in a fresh slot, each answer "
            "compared with the recorded one (a difference stops the fork unless --allow-divergence)"
        )
    if count > 1:
        workspace += f"; the other {count - 1} continuation(s) copy it inside their container"
    return {
        "source": rollout,
        "source_run": point.source_run,
        "at_turn": at_turn,
        "continuations": count,
        "reused": {
            "turns": prefix.turns,
            "messages": prefix.transcript.messages,
            "tokens": prefix.tokens.tokens if prefix.tokens else None,
        },
        "workspace": workspace,
        "rebuild": "snapshot" if snapshot else "replay",
        "not_carried": [NOT_CARRIED] if prefix.session_used and snapshot else [],
        "replayed_sessions": prefix.session_used and not snapshot,
    }
