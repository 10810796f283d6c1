"""`rollouts show`, `export`, `list` and `cancel` against a real batch: the dev server, the
sandbox process and the demo policy, with one rollout made to fail by a 400 from the policy."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError

from temporal_rollouts.cli import inspect as cli_inspect
from temporal_rollouts.cli.main import build_parser
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.pool import SandboxPool
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import batch_id, leased_slots, no_leases, wait_until
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
async def partial_batch(
    project_client: Client, worker: None, settings: Settings, demo_policy: DemoPolicyProcess
) -> BatchResult:
    """One item, two rollouts: the policy's first answer is a 400, so one rollout fails (model_rejected)."""
    demo_policy.reset()
    demo_policy.control(fail_next=1, fail_status=400)
    return await project_client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(env="terminal_tasks", num_items=1, group_size=2),
        id=batch_id("inspect"),
        task_queue=settings.temporal.task_queue,
    )


def _args(**values) -> argparse.Namespace:
    return argparse.Namespace(json=False, **values)


async def test_export_writes_every_rollout_failed_ones_included(
    partial_batch: BatchResult, settings: Settings, tmp_path: Path, capsys
) -> None:
    assert (partial_batch.completed, partial_batch.failed) == (1, 1)
    output = tmp_path / "out.jsonl"
    assert (
        await cli_inspect.cmd_export(_args(batch_id=partial_batch.batch_id, output=str(output), html=True), settings)
        == 0
    )
    assert "wrote 2 rollout(s)" in capsys.readouterr().out
    records = [json.loads(line) for line in output.read_text().splitlines()]
    by_status = {r["status"]: r for r in records}
    assert set(by_status) == {"completed", "failed"}
    failed = by_status["failed"]
    assert failed["result"]["stop_reason"] == "model_rejected" and failed["result"]["score"] is None
    assert [m["role"] for m in failed["messages"]] == ["system", "user"]  # the conversation it had, from the store
    scored = by_status["completed"]
    assert scored["result"]["score"] == 1.0
    assert any(m["role"] == "tool" for m in scored["messages"])
    assert any(m.get("tool_calls") for m in scored["messages"] if m["role"] == "assistant")
    page = (tmp_path / "out.html").read_text()  # the Atropos viewer's page: one group, both rollouts
    assert page.count('id="group-0-item-') == 2 and "model_rejected" in page and "stop reason  completed" in page


async def test_show_prints_the_conversation_and_why_it_stopped(
    partial_batch: BatchResult, settings: Settings, capsys
) -> None:
    rollouts = {f"{partial_batch.batch_id}/item-0/g{g}" for g in (0, 1)}
    texts = {}
    for rollout in rollouts:
        assert await cli_inspect.cmd_show(_args(rollout_id=rollout), settings) == 0
        texts[rollout] = capsys.readouterr().out
    scored = next(t for t in texts.values() if "stop reason  completed" in t)
    assert "[system]" in scored and "[user]" in scored and "[tool]" in scored
    assert "-> terminal(" in scored or "-> " in scored
    assert "score        1" in scored and "timings (s)" in scored
    failed = next(t for t in texts.values() if "model_rejected" in t)
    assert "not scored" in failed

    rollout = sorted(rollouts)[0]
    assert await cli_inspect.cmd_show(argparse.Namespace(rollout_id=rollout, json=True), settings) == 0
    whole = json.loads(capsys.readouterr().out)
    assert whole["rollout_id"] == rollout and whole["batch_id"] == partial_batch.batch_id
    assert whole["result"]["stop_reason"] in ("completed", "model_rejected")


async def test_show_of_an_unknown_rollout_names_it(settings: Settings, client: Client) -> None:
    with pytest.raises(ConfigError, match="no rollout with id 'nope/item-0/g0'"):
        await cli_inspect.cmd_show(_args(rollout_id="nope/item-0/g0"), settings)
    with pytest.raises(ConfigError, match="no batch with id 'no-such-batch'"):
        await cli_inspect.cmd_export(_args(batch_id="no-such-batch", output=None, html=False), settings)


def _list_args(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(["list", *argv])


async def test_list_shows_the_batch_with_its_counts(partial_batch: BatchResult, settings: Settings, capsys) -> None:
    assert await cli_inspect.cmd_list(_list_args("--json", "--limit", "50"), settings) == 0
    batches = {b["batch_id"]: b for b in json.loads(capsys.readouterr().out)}
    mine = batches[partial_batch.batch_id]
    assert (mine["status"], mine["total"], mine["completed"], mine["failed"]) == ("completed", 2, 1, 1)
    assert mine["outcome"] == "partial"
    assert mine["env"] == "terminal_tasks"
    assert await cli_inspect.cmd_list(_list_args("--limit", "50"), settings) == 0
    assert partial_batch.batch_id in capsys.readouterr().out


async def test_list_of_a_batch_lists_its_rollouts_filtered(
    partial_batch: BatchResult, settings: Settings, capsys
) -> None:
    batch = partial_batch.batch_id

    async def listed(*flags: str) -> list[dict]:
        assert await cli_inspect.cmd_list(_list_args(batch, "--json", *flags), settings) == 0
        return json.loads(capsys.readouterr().out)

    rows = await listed()
    assert [r["rollout_id"] for r in rows] == [f"{batch}/item-0/g0", f"{batch}/item-0/g1"]
    by_status = {r["status"]: r for r in rows}
    assert by_status["failed"]["stop_reason"] == "model_rejected" and by_status["failed"]["score"] is None
    assert by_status["completed"]["score"] == 1.0 and by_status["completed"]["turns"] >= 2
    assert [r["status"] for r in await listed("--status", "failed")] == ["failed"]
    assert [r["stop_reason"] for r in await listed("--stop-reason", "completed")] == ["completed"]
    assert [r["score"] for r in await listed("--min-score", "1")] == [1.0]
    assert await listed("--max-score", "0.5") == []  # a failed rollout has no score, not a zero

    assert await cli_inspect.cmd_list(_list_args(batch), settings) == 0
    text = capsys.readouterr().out
    assert text.splitlines()[0].split() == ["rollout", "status", "stop", "reason", "score", "turns"]
    assert f"{batch}/item-0/g0" in text and "2 rollouts of " in text
    with pytest.raises(ConfigError, match="no batch, training run or fork with id 'no-such-batch'"):
        await cli_inspect.cmd_list(_list_args("no-such-batch"), settings)
    with pytest.raises(ConfigError, match="unknown status 'broken'"):
        await cli_inspect.cmd_list(_list_args(batch, "--status", "broken"), settings)
    with pytest.raises(ConfigError, match="filter the rollouts of one batch"):
        await cli_inspect.cmd_list(_list_args("--status", "failed"), settings)


async def test_cancel_stops_the_batch_and_its_rollouts_give_back_their_slots(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess, capsys
) -> None:
    demo_policy.control(delay_s=2.0)
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="terminal_tasks", num_items=2, group_size=1),
        id=batch_id("cancel"),
        task_queue=settings.temporal.task_queue,
    )
    await wait_until(lambda: leased_slots(pool), timeout_s=60)
    assert await cli_inspect.cmd_cancel(_args(batch_id=handle.id), settings) == 0
    assert "cancelling" in capsys.readouterr().out
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    assert (await handle.describe()).status == WorkflowExecutionStatus.CANCELED
    assert await wait_until(lambda: no_leases(pool), timeout_s=30)
    with pytest.raises(ConfigError, match="is not running"):
        await cli_inspect.cmd_cancel(_args(batch_id=handle.id), settings)
