"""`rollouts fork ROLLOUT_ID --at-turn K -n N`: N continuations of a rollout from its turn K.

The continuations begin with the rollout's first K turns by reference (the same messages,
token ids and logprobs: nothing is generated again) and its workspace as it was after
turn K, then run as ordinary rollouts and are scored. They run as one RolloutTreeWorkflow:
the first continuation rebuilds the workspace (a snapshot of turn K if one was taken, else
a replay of the recorded tool calls compared with what they answered then) and the others
copy it from there. Before anything starts, this says what is reused, how the workspace
will be rebuilt and what cannot be carried.
"""

from __future__ import annotations

import argparse
import json
import uuid
from typing import Any

from temporalio.client import Client, WorkflowHandle
from temporalio.common import WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from activities.fork_points import ForkPoint, ForkPointInput, ForkPoints
from temporal_rollouts.cli.exit_codes import EXIT_OK, EXIT_PARTIAL
from temporal_rollouts.cli.records import id_taken
from temporal_rollouts.cli.resume import started_input
from temporal_rollouts.cli.screen import Column, labelled, screen_width, table_lines, wrapped
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
from temporal_rollouts.core.trees import RolloutTreeInput, RolloutTreeResult
from temporal_rollouts.runtime.registration import add_missing_search_attributes
from temporal_rollouts.cli.connection import command_client
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
    rebuild: WorkspaceRebuild = "auto",
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
    source = await started_input(client, client.get_workflow_handle(rollout, run_id=point.source_run), TrajectoryInput)
    assert isinstance(source, TrajectoryInput)
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


def format_plan(plan: dict[str, Any], width: int | None = None) -> str:
    reused = plan["reused"]
    tokens = f", {reused['tokens']} tokens with their logprobs" if reused["tokens"] is not None else ""
    fields = [
        (
            "reused",
            f"{reused['turns']} turn(s), {reused['messages']} messages{tokens} (by reference, not generated again)",
        ),
        ("workspace", plan["workspace"]),
        *(("not carried", item) for item in plan["not_carried"]),
    ]
    if plan["replayed_sessions"]:
        fields.append(
            (
                "note",
                "the stateful terminal's commands are replayed in a new session; processes they started are "
                "started again, not carried",
            )
        )
    head = f"forking {plan['source']} after turn {plan['at_turn']} into {plan['continuations']} continuation(s)"
    return "\n".join([head, *labelled(fields, width)])


RESULT_COLUMNS = [
    Column("rollout"),
    Column("workspace"),
    Column("stop"),
    Column("score", right=True),
    Column("turns", right=True),
]


def format_results(tree: RolloutTreeResult, width: int | None = None) -> str:
    rows, notes = [], []
    for result in tree.results:
        score = f"{result.score:g}" if not result.failed else "-"
        rows.append(
            (
                result.rollout_id,
                result.fork.workspace if result.fork else "-",
                result.stop_reason.value,
                score,
                str(result.turns),
            )
        )
        notes.append(
            [
                f"    diverged at turn {d.turn} ({d.tool}): recorded {d.recorded!r}, replayed {d.replayed!r}"
                for d in (result.fork.divergences if result.fork else [])[:3]
            ]
        )
    return "\n".join(table_lines(RESULT_COLUMNS, rows, width, notes))


async def cmd_fork(args: argparse.Namespace, settings: Settings) -> int:
    client = await command_client(settings)
    options = {
        "policy": args.policy,
        "temperature": args.temperature,
        "rebuild": args.rebuild,
        "allow_divergence": args.allow_divergence,
    }
    point = await find_fork_point(client, settings, args.rollout_id, args.at_turn)
    plan = describe_plan(args.rollout_id, args.at_turn, args.n, point, args.rebuild)
    if not args.json:
        print(format_plan(plan, screen_width()), flush=True)
    handle, point, roots = await start_fork(
        client, settings, args.rollout_id, args.at_turn, args.n, fork_id=args.id, point=point, **options
    )
    summary: dict[str, Any] = {"fork_id": handle.id, **plan, "first": roots[0], "rollouts": roots}
    if not args.json:
        print(f"started {handle.id}: {len(roots)} continuation(s)", flush=True)
        print("\n".join(f"  {rollout}" for rollout in roots), flush=True)
    if not args.wait:
        print(
            json.dumps(summary)
            if args.json
            else "\n".join(
                wrapped(
                    f"watch them with `rollouts list {handle.id}`, one with `rollouts show ROLLOUT_ID`", screen_width()
                )
            )
        )
        return EXIT_OK
    tree = RolloutTreeResult.model_validate(await handle.result())
    failed = [r for r in tree.results if r.failed]
    if args.json:
        summary["results"] = [
            {
                "rollout_id": r.rollout_id,
                "workspace": r.fork.workspace if r.fork else None,
                "stop_reason": r.stop_reason.value,
                "score": None if r.failed else r.score,
                "turns": r.turns,
                "completion_tokens": r.completion_tokens,
                "divergences": [d.model_dump() for d in (r.fork.divergences if r.fork else [])],
            }
            for r in tree.results
        ]
        print(json.dumps(summary))
    else:
        print(format_results(tree, screen_width()))
    return EXIT_PARTIAL if failed else EXIT_OK
