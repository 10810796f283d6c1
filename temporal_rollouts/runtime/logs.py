"""One log line per failed activity attempt, instead of a traceback.

The Temporal SDK logs every failed attempt as "Completing activity as failed" with the
full traceback. For the errors our code raises on purpose (ApplicationErrors made by
core/errors.py, such as a refused model connection) the traceback says nothing the
message does not, and a pool of rollouts retrying against a dead endpoint printed
thousands of lines. This filter rewrites those records into one line naming the
activity, the workflow, the attempt and the error; anything else (a bug) keeps its traceback.
"""

from __future__ import annotations

import logging

from temporalio.exceptions import ApplicationError

SDK_FAILURE_MESSAGE = "Completing activity as failed"


class OneLineActivityFailures(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if not record.exc_info or not str(record.msg).startswith(SDK_FAILURE_MESSAGE):
            return True
        err = record.exc_info[1]
        if not isinstance(err, ApplicationError):
            return True
        info = getattr(record, "temporal_activity", None) or {}
        attempt = info.get("attempt")
        outcome = "giving up" if err.non_retryable else "will retry"
        record.msg = "%s failed (attempt %s, %s) in %s: %s: %s"
        record.args = (
            info.get("activity_type", "activity"),
            attempt,
            outcome,
            info.get("workflow_id", "-"),
            err.type or "Error",
            err.message,
        )
        record.exc_info = None
        record.exc_text = None
        return True


def one_line_activity_failures() -> None:
    """Install the filter on the SDK's activity logger (idempotent)."""
    logger = logging.getLogger("temporalio.activity")
    if not any(isinstance(f, OneLineActivityFailures) for f in logger.filters):
        logger.addFilter(OneLineActivityFailures())
