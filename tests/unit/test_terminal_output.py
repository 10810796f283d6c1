"""What the terminal shows fits 80 columns, or wraps sanely, and never cuts an id; and what it
shows is true: a running rollout has no stop reason or score yet, a failed one has no score,
a batch whose every rollout failed is `failed`, a run ended by `train stop` is `stopped`."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from temporalio.client import WorkflowExecutionStatus

from temporal_rollouts.runtime.exit_codes import status_exit_code
from temporal_rollouts.cli.inspect import batch_lines, format_rollout
from temporal_rollouts.cli.list_rollouts import format_rows
from temporal_rollouts.cli.progress import format_status
from temporal_rollouts.cli.screen import Column, labelled, table_lines
from temporal_rollouts.cli.train import format_feed
from temporal_rollouts.client.records import BatchSummary, RolloutRecord, RolloutResult, batch_outcome
from temporal_rollouts.client.rollout_rows import RolloutRow
from temporal_rollouts.client.training import RunReport, run_outcome
from temporal_rollouts.core.feed import FeedFigures, FeedStatus, TrainerView
from temporal_rollouts.core.records import StopReason, TrajectoryResult

STARTED = datetime(2026, 11, 27, 18, 2, 11, tzinfo=UTC)


def summary(batch_id: str, **counts) -> BatchSummary:
    return BatchSummary(
        batch_id=batch_id,
        status=counts.pop("status", "completed"),
        env="terminal_tasks",
        policy="demo",
        started_at=STARTED,
        **counts,
    )


BATCHES = [
    summary("batch-terminal_tasks-1a2b3c4d", total=24, completed=24, failed=0, running=0, mean_score=1.0),
    summary("batch-terminal_tasks-5e6f7a8b", total=24, completed=0, failed=24, running=0),
    summary(
        "batch-swe_smith-0c1d2e3f",
        status="running",
        total=1000,
        completed=3,
        failed=1,
        running=32,
        mean_score=0.41,
        retrying=["32 rollouts waiting on llm_turn: model unreachable: connection refused, retry 3"],
    ),
]


def test_rollouts_list_fits_80_columns_and_keeps_every_id_whole() -> None:
    lines = batch_lines(BATCHES, 80)
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert lines[0].split() == ["batch", "status", "done", "failed", "score", "started"]
    for batch in BATCHES:
        assert any(line.split()[0] == batch.batch_id for line in lines)
    failed = next(line for line in lines if line.startswith("batch-terminal_tasks-5e6f7a8b"))
    assert failed.split()[1:4] == ["failed", "24/24", "24"]  # all failed: failed, not completed
    assert "  ! 32 rollouts waiting on llm_turn: model unreachable" in "\n".join(lines)


def test_a_wide_screen_shows_the_optional_columns_and_a_pipe_gets_whole_lines() -> None:
    wide = batch_lines(BATCHES, 200)
    assert wide[0].split() == ["batch", "status", "done", "failed", "score", "started", "running", "env", "policy"]
    assert batch_lines(BATCHES, None) == wide


def test_an_id_longer_than_the_screen_gets_a_line_of_its_own() -> None:
    long_id = "my-own-batch-for-the-second-checkout-of-the-project-" + "x" * 20
    lines = table_lines(
        [Column("batch"), Column("status"), Column("score", right=True)], [(long_id, "running", "-")], 40
    )
    assert lines[1] == long_id  # whole, for copying
    assert lines[2].split() == ["running", "-"] and len(lines[2]) <= 40


def test_a_batchs_rollouts_fit_80_columns() -> None:
    rows = [
        RolloutRow(
            rollout_id=f"batch-terminal_tasks-1a2b3c4d/item-{i}/g1",
            run_id="r",
            status="failed",
            stop_reason="model_unavailable",
            turns=3,
        )
        for i in range(12)
    ]
    lines = format_rows(rows, 80)
    assert all(len(line) <= 80 for line in lines) and len(lines) == 13, "\n".join(lines)
    assert lines[-1].split()[:4] == ["batch-terminal_tasks-1a2b3c4d/item-11/g1", "failed", "model_unavailable", "-"]


def test_labelled_values_wrap_under_themselves() -> None:
    value = "12 started, 4 in flight (1 finished, waiting for room in run-api), 8 posted, 0 posted stale, dropped: none"
    lines = labelled([("groups", value), ("trainer", "no trainer registered yet")], 60)
    assert all(len(line) <= 60 for line in lines)
    assert lines[0].startswith("  groups   12 started") and lines[1].startswith(" " * 11)
    assert " ".join(" ".join(lines[:-1]).split()) == f"groups {value}"


def result(**fields) -> TrajectoryResult:
    return TrajectoryResult(rollout_id="b/item-0/g0", env="echo_chain", item_id="echo-0", **fields)


def test_a_running_rollout_shows_no_stop_reason_and_no_score() -> None:
    placeholder = result(stop_reason=StopReason.COMPLETED, turns=2)  # what the workflow holds while it runs
    shown = RolloutResult.of(placeholder, WorkflowExecutionStatus.RUNNING)
    assert (shown.stop_reason, shown.score) == (None, None)
    record = RolloutRecord(rollout_id="b/item-0/g0", status="running", phase="turn 3", result=shown)
    text = format_rollout(record)
    assert "stop reason  - (still running (turn 3))" in text and "score        - (not scored yet)" in text
    assert "completed" not in text and "score        0" not in text
    assert record.shown()["result"]["stop_reason"] is None and record.shown()["result"]["score"] is None


def test_a_failed_rollout_has_no_score_and_keeps_its_stop_reason() -> None:
    failed = result(stop_reason=StopReason.MODEL_REJECTED, stop_detail="400 from the model", score=0.0)
    record = RolloutRecord(
        rollout_id="b/item-0/g0", status="failed", result=RolloutResult.of(failed, WorkflowExecutionStatus.FAILED)
    )
    exported = record.shown()["result"]
    assert exported["score"] is None and exported["stop_reason"] == "model_rejected"
    text = format_rollout(record)
    assert "stop reason  model_rejected: 400 from the model" in text
    assert "score        - (not scored: the rollout failed)" in text


def test_a_terminated_rollout_says_so_instead_of_its_placeholder() -> None:
    state = result(stop_reason=StopReason.COMPLETED, turns=1)  # read back by replay: it never recorded a reason
    shown = RolloutResult.of(state, WorkflowExecutionStatus.TERMINATED)
    assert (shown.stop_reason, shown.score) == (StopReason.TERMINATED, None)


def test_a_scored_rollout_keeps_its_score() -> None:
    shown = RolloutResult.of(result(stop_reason=StopReason.MAX_TURNS, score=0.0), WorkflowExecutionStatus.COMPLETED)
    assert (shown.stop_reason, shown.score) == (StopReason.MAX_TURNS, 0.0)  # a real 0: the model's own


@pytest.mark.parametrize(
    ("completed", "failed", "outcome", "code"), [(4, 0, "completed", 0), (3, 1, "partial", 3), (0, 4, "failed", 4)]
)
def test_one_definition_of_a_finished_batchs_state(completed: int, failed: int, outcome: str, code: int) -> None:
    assert batch_outcome("completed", completed, failed) == outcome
    assert summary("b", total=4, completed=completed, failed=failed).outcome == outcome
    data = {"batch_id": "b", "status": outcome, "total": 4, "completed": completed, "failed": failed}
    assert status_exit_code(data) == code
    assert format_status(data).startswith(f"batch b: {outcome}")


def test_status_wraps_its_long_lines_under_themselves() -> None:
    data = {
        "batch_id": "my-very-long-batch-name-for-a-second-experiment",
        "status": "failed",
        "total": 4,
        "completed": 0,
        "failed": 4,
        "stop_details": {"model_unavailable": "ModelUnreachable: model unreachable: connection refused " * 3},
    }
    lines = format_status(data, 80).splitlines()
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    why = next(i for i, line in enumerate(lines) if line.startswith("  why model_unavailable: "))
    assert lines[why + 1].startswith("    ModelUnreachable") or lines[why + 1].startswith("    model")


def feed(stopping: bool, posted: int = 0) -> FeedStatus:
    return FeedStatus(
        run="my-run",
        env="write_word",
        phase="done",
        in_flight=0,
        rollouts_running=0,
        figures=FeedFigures(groups_posted=posted),
        trainer=TrainerView(),
        max_staleness=1,
        admitted=False,
        stopping=stopping,
    )


def test_a_run_stopped_by_hand_is_stopped_not_completed() -> None:
    assert run_outcome("completed", feed(stopping=True)) == "stopped"
    assert run_outcome("completed", feed(stopping=False, posted=8)) == "completed"
    assert run_outcome("failed", None) == "failed"
    report = RunReport(**dict(feed(stopping=True)), outcome="stopped")
    assert format_feed(report).splitlines()[0] == "training run my-run (write_word): stopped"


def test_a_running_run_shows_what_it_retries_within_80_columns() -> None:
    running = feed(stopping=False).model_copy(update={"phase": "waiting for the trainer"})
    cause = "8 rollouts waiting on llm_turn: UndefinedError: 'dict object' has no attribute 'arguments', retry 4"
    report = RunReport(**dict(running), outcome="running", retrying=[cause])
    lines = format_feed(report, 80).splitlines()
    assert lines[0] == "training run my-run (write_word): running (waiting for the trainer)"
    assert all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert cause in " ".join(" ".join(lines).split())


async def test_train_status_watch_redraws_in_place_on_a_terminal(monkeypatch) -> None:
    import io

    from rich.console import Console

    from temporal_rollouts.cli import train

    reports = iter(
        [
            RunReport(**dict(feed(stopping=False).model_copy(update={"phase": "waiting"})), outcome="running"),
            RunReport(
                **dict(feed(stopping=False, posted=1).model_copy(update={"phase": "posting"})), outcome="running"
            ),
            RunReport(**dict(feed(stopping=True, posted=1)), outcome="stopped"),
        ]
    )

    async def next_report(client, name: str) -> RunReport:
        return next(reports)

    monkeypatch.setattr(train, "feed_status", next_report)
    monkeypatch.setattr(train, "WATCH_EVERY_S", 0.0)
    screen = io.StringIO()
    await train.watch_run(None, "my-run", Console(file=screen, force_terminal=True, width=80))  # type: ignore[arg-type]
    drawn = screen.getvalue()
    assert "\x1b[2K\x1b[1A" in drawn  # the block before is erased, line by line, not printed below
    redraws = drawn.split("\x1b[2K\x1b[1A")
    assert "running (waiting)" in redraws[0] and "stopped" in redraws[-1]  # each redraw over the one before
