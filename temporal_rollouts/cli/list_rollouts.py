"""`rollouts list ID`: the rollouts of a batch, a training run or a fork, filtered as the web page filters them.

The ids it prints are the ones `rollouts show` and `rollouts resume` take, so nobody has to
guess their format. Text for people; `--json` gives the rows (turns included) as one array.
"""

from __future__ import annotations

import argparse
import json

from temporalio.client import Client

from temporal_rollouts.cli.parsers import ROLLOUTS_LISTED
from temporal_rollouts.cli.records import describe_or_none
from temporal_rollouts.cli.rollout_rows import (
    RolloutFilter,
    RolloutRow,
    list_rollouts,
    read_outcomes,
)
from temporal_rollouts.cli.screen import Column, screen_width, table_lines
from temporal_rollouts.core.errors import ConfigError

TREE = "RolloutTreeWorkflow"
LISTED_TYPES = ("BatchWorkflow", "TrainingFeedWorkflow", TREE)
FILTER_FLAGS = ("status", "stop_reason", "min_score", "max_score")


def wanted_rollouts(args: argparse.Namespace) -> RolloutFilter:
    return RolloutFilter(**{flag: getattr(args, flag) for flag in FILTER_FLAGS})


def refuse_filters_without_a_batch(args: argparse.Namespace) -> None:
    if wanted_rollouts(args).narrows:
        raise ConfigError(
            "--status, --stop-reason, --min-score and --max-score filter the rollouts of one batch: "
            "name it, e.g. `rollouts list BATCH_ID --status failed`"
        )


ROW_COLUMNS = [
    Column("rollout"),
    Column("status"),
    Column("stop reason"),
    Column("score", right=True),
    Column("turns", right=True, optional=True),
]


def format_rows(rows: list[RolloutRow], width: int | None = None) -> list[str]:
    cells = [
        (
            row.rollout_id,
            row.status,
            row.stop_reason or "-",
            "-" if row.score is None else f"{row.score:g}",
            "-" if row.turns is None else str(row.turns),
        )
        for row in rows
    ]
    return table_lines(ROW_COLUMNS, cells, width)


async def tree_roots(client: Client, tree_id: str, run_id: str) -> list[str]:
    """The root rollouts of a rollout tree (a fork's, or a branching batch item's), from its input."""
    from temporal_rollouts.cli.resume import started_input
    from temporal_rollouts.core.trees import RolloutTreeInput

    tree = await started_input(client, client.get_workflow_handle(tree_id, run_id=run_id), RolloutTreeInput)
    assert isinstance(tree, RolloutTreeInput)
    return tree.root_ids


async def cmd_list_rollouts(client: Client, args: argparse.Namespace) -> int:
    described = await describe_or_none(client, args.batch_id)
    if described is None:
        raise ConfigError(f"no batch, training run or fork with id {args.batch_id!r} (see `rollouts list`)")
    if described.workflow_type not in LISTED_TYPES:
        raise ConfigError(
            f"{args.batch_id!r} is a {described.workflow_type}, not a batch, a training run or a fork "
            + ("(`rollouts show` shows a rollout)" if described.workflow_type == "TrajectoryWorkflow" else "")
        )
    roots = await tree_roots(client, args.batch_id, described.run_id) if described.workflow_type == TREE else None
    wanted = wanted_rollouts(args)
    rows = await list_rollouts(client, args.batch_id, wanted, limit=args.limit or ROLLOUTS_LISTED, roots=roots)
    outcomes = await read_outcomes(client, rows)
    for row in rows:
        if (outcome := outcomes.get(row.rollout_id)) is not None:
            row.turns = outcome.turns
    if args.json:
        print(json.dumps([row.model_dump(mode="json") for row in rows]))
        return 0
    shown = ", ".join(
        f"{flag.replace('_', ' ')} {value}" for flag, value in wanted.model_dump().items() if value is not None
    )
    if not rows:
        print(f"no rollouts of {args.batch_id}" + (f" with {shown}" if shown else ""))
        return 0
    print("\n".join(format_rows(rows, screen_width())))
    print(
        f"{len(rows)} rollout{'s' if len(rows) != 1 else ''} of {args.batch_id}"
        + (f" with {shown}" if shown else "")
        + "; `rollouts show ROLLOUT_ID` shows one"
    )
    return 0
