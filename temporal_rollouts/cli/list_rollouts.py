"""`rollouts list ID`: the rollouts of a batch, a training run or a fork, filtered as the web page filters them.

The ids it prints are the ones `rollouts show` and `rollouts resume` take, so nobody has to
guess their format. Text for people; `--json` gives the rows (turns included) as one array.
"""

from __future__ import annotations

import argparse
import json

from temporalio.client import Client

from temporal_rollouts.cli.screen import Column, screen_width, table_lines
from temporal_rollouts.client.rollout_rows import RolloutFilter, RolloutRow, rollouts_of
from temporal_rollouts.core.defaults import ROLLOUTS_LISTED
from temporal_rollouts.core.errors import ConfigError

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


async def cmd_list_rollouts(client: Client, args: argparse.Namespace) -> int:
    wanted = wanted_rollouts(args)
    rows = await rollouts_of(client, args.batch_id, wanted, limit=args.limit or ROLLOUTS_LISTED)
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
