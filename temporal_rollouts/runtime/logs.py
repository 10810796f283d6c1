"""A worker's logs: one line per failed attempt on the console, every traceback in the log file.

The Temporal SDK logs every failed activity attempt as "Completing activity as failed" with the
full traceback. A pool of rollouts retrying against a dead endpoint, or a chat template that
cannot render, printed thousands of traceback lines, where one line naming the activity, the
rollout, the attempt and the error says what a person needs. So the console (stderr) gets
that line for every failed attempt, whatever the error, and one line for any other record
that carries a traceback, naming the log file; the log file (`<data_dir>/logs/worker.log`,
or `--verbose` on the console) keeps the tracebacks, which a bug needs.
"""

from __future__ import annotations

import copy
import logging
import logging.handlers
import sys
from pathlib import Path

from temporalio.exceptions import ApplicationError

SDK_FAILURE_MESSAGE = "Completing activity as failed"
FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
QUIET_LOGGERS = {"httpx": logging.WARNING}
"""One line per request drowns everything else."""


def worker_log(data_dir: Path) -> Path:
    return data_dir / "logs" / "worker.log"


def attempt_line(record: logging.LogRecord) -> str | None:
    """`llm_turn failed (attempt 2, will retry) in ROLLOUT: ModelUnreachable: ...` for the SDK's record of a
    failed activity attempt; None for any other record."""
    if not record.exc_info or not str(record.msg).startswith(SDK_FAILURE_MESSAGE):
        return None
    err = record.exc_info[1]
    info = getattr(record, "temporal_activity", None) or {}
    if isinstance(err, ApplicationError):
        outcome = "giving up" if err.non_retryable else "will retry"
        kind, message = err.type or "Error", err.message
    else:  # not one of ours: Temporal retries it, unless the retry policy says otherwise
        outcome, kind, message = "will retry unless its retries are spent", type(err).__name__, str(err)
    return (
        f"{info.get('activity_type', 'activity')} failed (attempt {info.get('attempt')}, {outcome}) "
        f"in {info.get('workflow_id', '-')}: {kind}: {message}"
    )


class OneLineFormatter(logging.Formatter):
    """The console's format: a failed attempt is `attempt_line`; any other record with a traceback is its
    message and the exception in one line, with where the traceback went (`traceback_in`)."""

    def __init__(self, traceback_in: Path | None = None) -> None:
        super().__init__(FORMAT)
        self._where = f" (traceback in {traceback_in})" if traceback_in else ""

    def format(self, record: logging.LogRecord) -> str:
        if not record.exc_info:
            return super().format(record)
        shown = copy.copy(record)  # the other handlers (the log file) keep the traceback
        line = attempt_line(record)
        if line is None:
            err = record.exc_info[1]
            line = f"{record.getMessage()}: {type(err).__name__}: {err}{self._where}"
        shown.msg, shown.args, shown.exc_info, shown.exc_text, shown.stack_info = line, None, None, None, None
        return super().format(shown)


def configure_logging(data_dir: Path, *, verbose: bool = False, console_level: int = logging.INFO) -> Path:
    """Log INFO and up to `<data_dir>/logs/worker.log` with tracebacks, and `console_level` and up to
    stderr in one line a record (tracebacks too with `verbose`); returns the log file. Idempotent."""
    path = worker_log(data_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "rollouts_handler", False)]:
        root.removeHandler(handler)
        handler.close()
    logfile = logging.handlers.WatchedFileHandler(path, encoding="utf-8")  # works with logrotate
    logfile.setFormatter(logging.Formatter(FORMAT))
    console = logging.StreamHandler(sys.stderr)
    console.setLevel(console_level)
    console.setFormatter(logging.Formatter(FORMAT) if verbose else OneLineFormatter(path))
    for handler in (logfile, console):
        handler.rollouts_handler = True  # type: ignore[attr-defined]
        root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name, level in QUIET_LOGGERS.items():
        logging.getLogger(name).setLevel(level)
    return path
