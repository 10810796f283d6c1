"""A worker's console shows one line per failed attempt, whatever the error; its log file keeps the
traceback; `--verbose` puts the traceback on the console too. The records are made by the SDK's own
activity logger, as a worker makes them."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio import activity
from temporalio.exceptions import ApplicationError

from temporal_rollouts.runtime.logs import configure_logging

ACTIVITY = {"activity_type": "llm_turn", "attempt": 2, "workflow_id": "b/item-0/g1"}


@pytest.fixture
def console(capsys) -> Iterator[pytest.CaptureFixture]:
    yield capsys
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "rollouts_handler", False)]:
        root.removeHandler(handler)
        handler.close()


def fail_attempt(err: BaseException) -> None:
    """What the SDK logs when an activity attempt raises `err`."""
    try:
        raise err
    except BaseException:
        activity.logger.logger.warning(
            "Completing activity as failed ({'activity_id': '1'})", exc_info=True, extra={"temporal_activity": ACTIVITY}
        )


def bug() -> None:
    {}["arguments"]  # a template that cannot render, an unexpected KeyError: a bug, with a traceback worth keeping


def test_each_failed_attempt_is_one_line_and_the_traceback_goes_to_the_log_file(tmp_path: Path, console) -> None:
    log_file = configure_logging(tmp_path)
    fail_attempt(ApplicationError("model unreachable: connection refused", type="ModelUnreachable"))
    try:
        bug()
    except KeyError as err:
        fail_attempt(err)
    lines = console.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert lines[0].endswith(
        "llm_turn failed (attempt 2, will retry) in b/item-0/g1: ModelUnreachable: model unreachable: connection refused"
    )
    assert lines[1].endswith(
        "llm_turn failed (attempt 2, will retry unless its retries are spent) in b/item-0/g1: KeyError: 'arguments'"
    )
    written = log_file.read_text()
    assert written.count("Traceback (most recent call last)") == 2 and "in bug" in written


def test_any_other_traceback_is_one_line_naming_the_log_file(tmp_path: Path, console) -> None:
    log_file = configure_logging(tmp_path)
    try:
        bug()
    except KeyError:
        logging.getLogger("temporalio.worker._workflow_instance").exception("Failed activation on workflow")
    (line,) = console.readouterr().err.splitlines()
    assert line.endswith(f"Failed activation on workflow: KeyError: 'arguments' (traceback in {log_file})")
    assert "Traceback (most recent call last)" in log_file.read_text()


def test_verbose_puts_the_traceback_on_the_console_too(tmp_path: Path, console) -> None:
    configure_logging(tmp_path, verbose=True)
    fail_attempt(ApplicationError("model unreachable: connection refused", type="ModelUnreachable"))
    assert "Traceback (most recent call last)" in console.readouterr().err


def test_configuring_again_replaces_the_handlers(tmp_path: Path, console) -> None:
    configure_logging(tmp_path)
    configure_logging(tmp_path, console_level=logging.WARNING)
    logging.getLogger("temporal_rollouts.worker").info("polling")
    logging.getLogger("temporal_rollouts.worker").warning("draining")
    assert console.readouterr().err.count("draining") == 1
    assert (tmp_path / "logs" / "worker.log").read_text().count("polling") == 1
