"""No state is shown that is not true, against the real dev server, sandbox and demo policy: a running
rollout has neither stop reason nor score yet; a failed one is exported without a score; `--id` of a
batch that ran is refused; `rollouts list` names what a running batch's steps retry; a training run
whose every model turn fails says why in `train status` and the web page's data, and once stopped
with `--now` it is `stopped`, not `completed`."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from temporalio.client import Client

from temporal_rollouts.cli import inspect as cli_inspect
from temporal_rollouts.cli.main import build_parser
from temporal_rollouts.client.batches import start_batch
from temporal_rollouts.client.records import list_batches, waiting_on_retries
from temporal_rollouts.client.training import feed_status, list_training_runs
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.feed import FeedInput
from temporal_rollouts.core.records import BatchInput, BatchResult, RolloutLimits
from temporal_rollouts.core.settings import ChatPolicy, Settings
from tests.support import TEMPLATES
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.servers.process import free_port
from tests.support.waiting import batch_id, wait_until
from workflows.batch import BatchWorkflow
from workflows.feed import TrainingFeedWorkflow

pytestmark = pytest.mark.slow


def closed_port() -> int:
    """A port nothing listens on (this worker's own range: no other worker's server takes it)."""
    return free_port()


async def test_a_running_rollout_shows_no_stop_reason_and_no_score_yet(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess, capsys
) -> None:
    demo_policy.control(delay_s=1.5)
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=1, env_config={"steps": 3}),
        id=batch_id("running-show"),
        task_queue=settings.temporal.task_queue,
    )
    rollout = f"{handle.id}/item-0/g0"

    async def turning() -> bool:
        listed = [e async for e in client.list_workflows(f"WorkflowId = '{rollout}'")]
        if not listed:
            return False
        return (await client.get_workflow_handle(rollout).query("progress"))["phase"].startswith("turn ")

    await wait_until(turning, timeout_s=60)
    assert await cli_inspect.cmd_show(argparse.Namespace(rollout_id=rollout, json=False), settings) == 0
    text = capsys.readouterr().out
    assert "(running;" in text and "stop reason  - (still running (turn " in text, text
    assert "score        - (not scored yet)" in text
    assert "stop reason  completed" not in text and "score        0" not in text
    assert await cli_inspect.cmd_show(argparse.Namespace(rollout_id=rollout, json=True), settings) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["status"] == "running" and shown["result"]["stop_reason"] is None and shown["result"]["score"] is None
    demo_policy.reset()
    assert BatchResult.model_validate(await handle.result()).completed == 1


async def test_a_failed_rollout_is_exported_without_a_score_and_an_id_that_ran_is_refused(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess, tmp_path: Path, capsys
) -> None:
    demo_policy.control(fail_next=1, fail_status=400)
    done = BatchResult.model_validate(
        await client.execute_workflow(
            BatchWorkflow.run,
            BatchInput(env="echo_chain", num_items=1, group_size=2),
            id=batch_id("export-null"),
            task_queue=settings.temporal.task_queue,
        )
    )
    assert (done.completed, done.failed) == (1, 1)
    output = tmp_path / "rollouts.jsonl"
    args = argparse.Namespace(batch_id=done.batch_id, output=str(output), html=False, json=False)
    assert await cli_inspect.cmd_export(args, settings) == 0
    records = {r["status"]: r["result"] for r in map(json.loads, output.read_text().splitlines())}
    assert records["failed"]["stop_reason"] == "model_rejected" and records["failed"]["score"] is None
    assert records["completed"]["score"] == 1.0

    again = BatchInput(env="echo_chain", num_items=1, group_size=1, policy="demo")
    with pytest.raises(ConfigError, match=rf"batch {done.batch_id} already ran \(it is partial\): choose another"):
        await start_batch(client, settings, again, done.batch_id)
    runs = [e async for e in client.list_workflows(f"WorkflowId = '{done.batch_id}'")]
    assert len(runs) == 1, "no second run was started under the id"


async def test_rollouts_list_names_what_a_running_batchs_steps_retry(
    client: Client, settings: Settings, capsys
) -> None:
    handle = await client.start_workflow(
        BatchWorkflow.run,
        BatchInput(env="echo_chain", num_items=1, group_size=2, policy=f"http://127.0.0.1:{closed_port()}/v1"),
        id=batch_id("list-retrying"),
        task_queue=settings.temporal.task_queue,
    )
    await wait_until(lambda: waiting_on_retries(client, handle.id), timeout_s=20)
    mine = next(b for b in await list_batches(client, 50) if b.batch_id == handle.id)
    assert mine.outcome == "running"
    assert mine.retrying and mine.retrying[0].startswith("2 rollouts waiting on llm_turn: model unreachable"), mine
    assert await cli_inspect.cmd_list(build_parser().parse_args(["list", "--limit", "50"]), settings) == 0
    printed = capsys.readouterr().out.splitlines()
    row = next(i for i, line in enumerate(printed) if line.startswith(handle.id))
    assert printed[row + 1].startswith("  ! 2 rollouts waiting on llm_turn: model unreachable"), printed
    await handle.result()


async def test_a_training_run_that_fails_every_turn_says_why_and_stopped_now_is_stopped(
    client: Client, settings: Settings, tmp_path: Path, smollm2_tokenizer_dir: Path
) -> None:
    tokenizer = smollm2_tokenizer_dir
    settings.policies["unreachable-sft"] = ChatPolicy(
        base_url=f"http://127.0.0.1:{closed_port()}/v1",
        tokenizer=str(tokenizer),
        chat_template=str(TEMPLATES / "qwen2_5.jinja"),
    )
    run = batch_id("failing-run")
    try:
        handle = await client.start_workflow(
            TrainingFeedWorkflow.run,
            FeedInput(
                env="echo_chain",
                policy="unreachable-sft",
                group_size=2,
                max_groups=1,
                sink="jsonl",
                limits=RolloutLimits(max_turns=2),
            ),
            id=run,
            task_queue=settings.temporal.task_queue,
        )

        async def says_why() -> list[str]:
            return (await feed_status(client, run)).retrying

        why = await wait_until(says_why, timeout_s=30)
        assert "waiting on llm_turn: model unreachable: connection refused, retry" in why[0], why
        listed = next(r for r in await list_training_runs(client) if r.run == run)
        assert listed.outcome == "running" and listed.retrying, listed

        await handle.signal("stop_now")
        await handle.result()
        report = await feed_status(client, run)
        assert (report.outcome, report.figures.groups_posted) == ("stopped", 0)
        listed = next(r for r in await list_training_runs(client) if r.run == run)
        assert (listed.status, listed.outcome, listed.groups_posted) == ("completed", "stopped", 0)
    finally:
        settings.policies.pop("unreachable-sft", None)
