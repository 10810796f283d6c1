"""The batch progress bar: the batch's id, one row that always fits, and the lines under it.

Rich lays a progress row out as a table: text that is too long for the row (counts, the
causes of retries) pushes the bar, the count and the elapsed time off the screen. So the
row holds only what has a fixed width (spinner, bar, done/total, elapsed time); the batch id,
which a person copies into the next command, is a line of its own above it, whole; and the
counts and retry causes are lines of their own under it, which wrap rather than being cut,
so a retry number is never lost at 80 columns.
"""

from __future__ import annotations

from rich.console import Console, RenderableType
from rich.padding import Padding
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TimeElapsedColumn,
)
from rich.table import Column
from rich.text import Text

from temporal_rollouts.core.records import BatchProgress


def counts_line(progress: BatchProgress) -> str:
    """`running 16  queued 36  failed 0  mean score -`: every rollout not done is running or queued."""
    queued = max(progress.total - progress.completed - progress.failed - progress.running, 0)
    mean = "-" if progress.mean_score is None else f"{progress.mean_score:.2f}"
    return f"running {progress.running}  queued {queued}  failed {progress.failed}  mean score {mean}"


class BatchBar(Progress):
    """A Progress of one batch: its id above its row, and `notes` under it, each wrapped to the screen."""

    def __init__(self, console: Console, batch_id: str) -> None:
        self.notes: list[tuple[str, str]] = []
        self.batch_id = batch_id
        super().__init__(
            SpinnerColumn(),
            BarColumn(bar_width=None, table_column=Column(ratio=1, min_width=10)),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console,
            transient=False,
            expand=True,
        )

    def get_renderables(self) -> list[RenderableType]:
        title = Text.assemble("batch ", (self.batch_id, "bold"), overflow="fold")
        lines = [Padding(Text(text, style=style), (0, 0, 0, 2)) for text, style in self.notes]
        return [title, self.make_tasks_table(self.tasks), *lines]

    def show(self, progress: BatchProgress, retry_lines: list[str]) -> None:
        self.notes = [(counts_line(progress), ""), *((line, "yellow") for line in retry_lines)]
