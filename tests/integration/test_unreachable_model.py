"""A model endpoint that refuses connections, or accepts and never answers, fails its rollouts
within a stated bound; meanwhile `rollouts status` names the cause of the retries, and the
worker logs one line per failed attempt, not a traceback. Real dev server, real sandbox, a
real closed port and a real listening socket that never answers."""

from __future__ import annotations

import io
import logging
import socket
import time
from collections.abc import Iterator

import pytest
from rich.console import Console
from temporalio.client import Client

from temporal_rollouts.cli.progress import format_status, print_summary, watch
from temporal_rollouts.client.batches import batch_status
from temporal_rollouts.client.records import waiting_on_retries
from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.runtime.exit_codes import status_exit_code
from temporal_rollouts.runtime.logs import OneLineFormatter
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.servers.process import free_port
from tests.support.waiting import batch_id, wait_until
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

REFUSED_BOUND_S = 20.0
"""ModelUnreachable gives up on the 4th attempt: 1 + 2 + 4 s of backoff, plus steps and slack."""
STALL_TIMEOUT_S = 2.0
STALLED_BOUND_S = 2 * STALL_TIMEOUT_S + 12.0
"""ModelStalled gives up on the 2nd attempt: two request timeouts and a 1 s backoff, plus slack."""


def closed_port() -> int:
    """A port nothing listens on (this worker's own range: no other worker's server takes it)."""
    return free_port()


@pytest.fixture
def silent_server() -> Iterator[int]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(64)
        yield server.getsockname()[1]


async def test_a_refusing_endpoint_fails_its_rollouts_fast_and_status_says_why(
    client: Client, settings: Settings, caplog
) -> None:
    caplog.set_level(logging.WARNING, logger="temporalio.activity")
    url = f"http://127.0.0.1:{closed_port()}/v1"
    started = time.monotonic()
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=2, policy=url),
        id=batch_id("refused"),
        task_queue=settings.temporal.task_queue,
    )
    notes = await wait_until(lambda: waiting_on_retries(client, handle.id), timeout_s=REFUSED_BOUND_S)
    assert notes[0].activity == "llm_turn"
    assert notes[0].headline.startswith("model unreachable: connection refused, retry "), notes[0]
    status = await batch_status(client, handle.id)
    assert status["status"] == "running" and status_exit_code(status) == 0
    assert "model unreachable: connection refused, retry" in format_status(status)

    result = BatchResult.model_validate(await handle.result())
    elapsed = time.monotonic() - started
    assert (result.failed, result.stop_reasons) == (2, {"model_unavailable": 2})
    assert elapsed < REFUSED_BOUND_S, f"took {elapsed:.1f}s"
    status = await batch_status(client, handle.id)
    assert status_exit_code(status) == 4
    assert "2 rollouts: 0 scored, 2 failed" in format_status(status)

    console = OneLineFormatter()  # what the worker's console shows of each record
    failures = [
        console.format(r)
        for r in caplog.records
        if r.name == "temporalio.activity" and "llm_turn failed" in console.format(r)
    ]
    assert len(failures) == 8, failures  # 2 rollouts x 4 attempts, one line each
    assert all("\n" not in line for line in failures)
    assert sum("giving up" in line for line in failures) == 2
    assert "ModelUnreachable: model unreachable: connection refused" in failures[0]
    assert status["status"] == "failed"  # every rollout failed: the batch is failed, as `rollouts list` says


async def test_a_stalled_endpoint_is_given_up_after_two_request_timeouts(
    client: Client, settings: Settings, silent_server: int, monkeypatch
) -> None:
    monkeypatch.setitem(
        settings.policies,
        "stalled-test",
        ChatPolicy(base_url=f"http://127.0.0.1:{silent_server}/v1", timeout_s=STALL_TIMEOUT_S),
    )
    started = time.monotonic()
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=1, policy="stalled-test"),
        id=batch_id("stalled"),
        task_queue=settings.temporal.task_queue,
    )
    # before its timeout, a stalled attempt shows as one with no answer yet
    notes = await wait_until(lambda: waiting_on_retries(client, handle.id, slow_after_s=1.0), timeout_s=STALLED_BOUND_S)
    assert notes[0].activity == "llm_turn" and notes[0].headline.startswith("no answer yet (running "), notes[0]
    result = BatchResult.model_validate(await handle.result())
    elapsed = time.monotonic() - started
    assert result.stop_reasons == {"model_unavailable": 1}
    assert 2 * STALL_TIMEOUT_S <= elapsed < STALLED_BOUND_S, f"took {elapsed:.1f}s"


async def test_the_progress_bar_shows_the_rollouts_waiting_on_retries(client: Client, settings: Settings) -> None:
    url = f"http://127.0.0.1:{closed_port()}/v1"
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=2, policy=url),
        id=batch_id("refused-bar"),
        task_queue=settings.temporal.task_queue,
    )
    screen = io.StringIO()
    result = await watch(client, handle, Console(file=screen, force_terminal=True, width=200))
    assert result.failed == 2
    assert "2 rollouts waiting on llm_turn: model unreachable: connection refused, retry" in screen.getvalue()


async def test_a_policy_url_without_v1_says_why_in_the_summary(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess
) -> None:
    """The demo policy's root instead of its /v1: every request is a 404. The summary, not only
    `rollouts show`, says so and suggests /v1."""
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=1, policy=demo_policy.url),
        id=batch_id("no-v1"),
        task_queue=settings.temporal.task_queue,
    )
    result = BatchResult.model_validate(await handle.result())
    assert result.stop_reasons == {"model_rejected": 1}
    hint = f"try {demo_policy.url}/v1"
    assert hint in result.stop_details["model_rejected"]
    screen = io.StringIO()
    print_summary(result, Console(file=screen, width=100), settings)
    assert hint in " ".join(screen.getvalue().split())
    assert hint in format_status(await batch_status(client, handle.id))
