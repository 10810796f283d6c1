"""`rollouts fork ROLLOUT_ID --at-turn K -n N`: N continuations of a rollout from its turn K.

Before anything starts, this says what is reused, how the workspace will be rebuilt and what
cannot be carried (client/forks.py finds the fork point and starts the fork's tree); then it
prints the id of every continuation, and with --wait how each ended.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from temporal_rollouts.cli.screen import Column, labelled, screen_width, table_lines, wrapped
from temporal_rollouts.client.connection import command_client
from temporal_rollouts.client.forks import describe_plan, find_fork_point, start_fork
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.trees import RolloutTreeResult
from temporal_rollouts.runtime.exit_codes import EXIT_OK, EXIT_PARTIAL


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
