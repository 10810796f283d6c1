"""What a person watching a batch reads: the progress bar, rendered by rich to consoles of fixed
width while steps are retried (every column of the row stays on screen and each retry line keeps
its retry number), and `rollouts status`, which accounts for every rollout."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from temporal_rollouts.cli.progress import format_status
from temporal_rollouts.cli.progress_bar import BatchBar
from temporal_rollouts.core.records import BatchProgress

BATCH = "long-batch-terminal_tasks-1a2b3c4d"
RETRIES = [
    "16 rollouts waiting on llm_turn: model unreachable: connection refused, retry 3",
    "2 rollouts waiting on verify: sandbox unreachable: connect timed out, retry 12",
]


def rendered(width: int) -> list[str]:
    screen = io.StringIO()
    console = Console(file=screen, width=width, force_terminal=False, color_system=None)
    bar = BatchBar(console, BATCH)
    task = bar.add_task(BATCH, total=64)
    bar.update(task, completed=12)
    bar.show(
        BatchProgress(batch_id=BATCH, env="terminal_tasks", total=64, completed=12, running=16, score_sum=6.0), RETRIES
    )
    console.print(bar.get_renderable())
    return [line.rstrip() for line in screen.getvalue().splitlines()]


@pytest.mark.parametrize("width", [80, 120])
def test_the_row_keeps_its_bar_count_and_time_while_steps_are_retried(width: int) -> None:
    lines = rendered(width)
    assert lines[0] == f"batch {BATCH}"  # the id whole, on a line of its own
    row = lines[1]
    assert len(row) <= width
    assert "━" in row  # the bar
    assert "12/64" in row
    assert row.endswith("0:00:00")  # the elapsed time, last and whole
    text = "\n".join(lines)
    assert "running 16  queued 36  failed 0  mean score 0.50" in text


@pytest.mark.parametrize("width", [80, 120])
def test_retry_lines_wrap_rather_than_lose_their_retry_number(width: int) -> None:
    lines = rendered(width)
    assert all(len(line) <= width for line in lines)
    joined = " ".join(line.strip() for line in lines[3:])
    for retry in RETRIES:
        assert retry in joined


def test_status_counts_the_queued_rollouts_too() -> None:
    data = {
        "batch_id": "b",
        "status": "running",
        "total": 64,
        "completed": 14,
        "failed": 0,
        "running": 14,
        "mean_score": 1.0,
    }
    assert "64 rollouts: 14 scored, 0 failed, 14 running, 36 queued" in format_status(data)
    data |= {"status": "completed", "completed": 64, "running": 0}
    assert "64 rollouts: 64 scored, 0 failed\n" in format_status(data)
