"""`rollouts list BATCH_ID`: the rollouts of a batch or training run, filtered as the web page filters them.

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
from temporal_rollouts.core.errors import ConfigError

LISTED_TYPES = ("BatchWorkflow", "TrainingFeedWorkflow")
FILTER_FLAGS = ("status", "stop_reason", "min_score", "max_score")


def wanted_rollouts(args: argparse.Namespace) -> RolloutFilter:
    return RolloutFilter(**{flag: getattr(args, flag) for flag in FILTER_FLAGS})


def refuse_filters_without_a_batch(args: argparse.Namespace) -> None:
    if wanted_rollouts(args).narrows:
        raise ConfigError(
            "--status, --stop-reason, --min-score and --max-score filter the rollouts of one batch: "
            "name it, e.g. `rollouts list BATCH_ID --status failed`"
        )


def format_rows(rows: list[RolloutRow]) -> list[str]:
    header = ("rollout", "status", "stop reason", "score", "turns")
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
    widths = [max(len(line[i]) for line in [header, *cells]) for i in range(len(header))]

    def line(values: tuple[str, ...]) -> str:
        left = "  ".join(value.ljust(width) for value, width in zip(values[:3], widths[:3], strict=True))
        right = "  ".join(value.rjust(width) for value, width in zip(values[3:], widths[3:], strict=True))
        return f"{left}  {right}"

    return [line(header), *(line(values) for values in cells)]


async def cmd_list_rollouts(client: Client, args: argparse.Namespace) -> int:
    described = await describe_or_none(client, args.batch_id)
    if described is None:
        raise ConfigError(f"no batch with id {args.batch_id!r} (see `rollouts list`)")
    if described.workflow_type not in LISTED_TYPES:
        raise ConfigError(f"{args.batch_id!r} is a {described.workflow_type}, not a batch or a training run")
    wanted = wanted_rollouts(args)
    rows = await list_rollouts(client, args.batch_id, wanted, limit=args.limit or ROLLOUTS_LISTED)
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
    print("\n".join(format_rows(rows)))
    print(
        f"{len(rows)} rollout{'s' if len(rows) != 1 else ''} of {args.batch_id}"
        + (f" with {shown}" if shown else "")
        + "; `rollouts show ROLLOUT_ID` shows one"
    )
    return 0
