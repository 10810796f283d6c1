"""The Atropos env (integrations/atropos/env.py) run as Atropos users run it, as its own
process: `serve` against the real `run-api` with a trainer pulling batches (through the
durable training feed it starts, which survives the env process being killed), `process`
writing JSONL and HTML, `evaluate` writing metrics. Its rollouts are Temporal workflows
run by the test worker, with SmolLM2 behind a real `/generate` (steered by the demo
policy as in test_token_rollout.py), or the demo policy itself with a local tokenizer."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import signal
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from temporal_rollouts.core.records import TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.token_trace import IGNORE_INDEX
from temporal_rollouts.policy_servers import smollm2
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from tests.support import REPO, TEMPLATES
from tests.support.processes import settings_environment
from tests.support.servers.fixtures import LOGPROB_TOLERANCE, GenerateServerProcess, generate_policy
from tests.support.servers.run_api import RunApiProcess, pull_batch, register_trainer
from temporal_rollouts.runtime.worker import Parts

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ENV_WAIT_S = 300.0


@pytest.fixture
def smol(settings: Settings, smollm2_server: GenerateServerProcess) -> Iterator[str]:
    settings.policies["smol"] = generate_policy(smollm2_server)
    yield "smol"
    settings.policies.pop("smol", None)


def run_env(
    command: str, settings: Settings, tokenizer: Path, tmp_path: Path, *arguments: str, **env_fields
) -> subprocess.Popen:
    """`python -m temporal_rollouts.integrations.atropos.env COMMAND --config run.yaml [ARGUMENTS]`, configured
    as a user would."""
    fields = {
        "task_env": "echo_chain",
        "env_config": {"steps": 1},
        "policy": "smol",
        "group_size": 2,
        "max_agent_turns": 3,
        "agent_max_tokens": 6,
        "use_wandb": False,
        "tokenizer_name": str(tokenizer),
        "wandb_name": "tests",
        "run_name": f"env-{uuid.uuid4().hex[:6]}",
        "total_steps": 1,
        "max_token_length": 4096,
        **env_fields,
    }
    config = tmp_path / f"{command}.yaml"
    config.write_text(yaml.safe_dump({"env": fields}))
    environment = {**os.environ, **settings_environment(settings), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "disabled"}
    log = open(tmp_path / f"{command}.log", "ab")
    argv = [
        sys.executable,
        "-m",
        "temporal_rollouts.integrations.atropos.env",
        command,
        "--config",
        str(config),
        *arguments,
    ]
    return subprocess.Popen(argv, cwd=REPO, env=environment, stdout=log, stderr=subprocess.STDOUT)


async def finish(proc: subprocess.Popen, tmp_path: Path, command: str) -> None:
    """Wait for the env to exit without blocking the event loop the test worker runs on."""
    try:
        code = await asyncio.to_thread(proc.wait, ENV_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert code == 0, (tmp_path / f"{command}.log").read_text()[-3000:]


async def test_serve_posts_groups_a_trainer_pulls_with_tokens_masks_and_logprobs(
    settings: Settings,
    parts: Parts,
    client,
    smol: str,
    smollm2_server: GenerateServerProcess,
    smollm2_model,
    tmp_path: Path,
) -> None:
    run_api = RunApiProcess(tmp_path / "run_api.log")
    run_api.start()
    try:
        async with TrajectoryApi(run_api.url) as api:
            await register_trainer(api, batch_size=2, max_token_len=4096, checkpoint_dir=tmp_path)
            proc = run_env(
                "serve",
                settings,
                smollm2_server.tokenizer_dir,
                tmp_path,
                rollout_server_url=run_api.url,
                ensure_scores_are_not_same=False,
                steps_per_eval=0,
            )
            try:
                batch = await pull_batch(api, timeout_s=ENV_WAIT_S)
            except BaseException:
                proc.kill()
                raise
            await finish(proc, tmp_path, "serve")  # its stop condition holds once the trainer took a batch
    finally:
        run_api.stop()

    (group,) = batch
    assert len(group["tokens"]) == 2 and group["env_id"] == 0
    assert group["group_overrides"]["tool_errors"] == 0
    for index, override in enumerate(group["overrides"]):
        rollout = await client.get_workflow_handle(override["rollout_id"], result_type=TrajectoryResult).result()
        trace = await parts.traces.load(rollout.tokens)
        assert group["tokens"][index] == trace.tokens, "tokens arrive intact"
        assert group["masks"][index] == trace.masks()
        assert group["inference_logprobs"][index] == trace.inference_logprobs()
        trained = [i for i, m in enumerate(group["masks"][index]) if m != IGNORE_INDEX]
        assert trained, "the model wrote part of every turn"
        fresh = smollm2.forward_logprobs(smollm2_model, group["tokens"][index])
        assert max(abs(group["inference_logprobs"][index][i] - fresh[i - 1]) for i in trained) < LOGPROB_TOLERANCE


async def test_process_writes_jsonl_and_html_that_atropos_reads(
    settings: Settings, worker, smol: str, smollm2_server: GenerateServerProcess, tmp_path: Path
) -> None:
    from atroposlib.frontend.jsonl2html import generate_html

    out = tmp_path / "out" / "groups.jsonl"
    proc = run_env("process", settings, smollm2_server.tokenizer_dir, tmp_path, data_path_to_save_groups=str(out))
    await finish(proc, tmp_path, "process")
    (line,) = out.read_text().splitlines()
    group = json.loads(line)
    assert len(group["tokens"]) == len(group["masks"]) == len(group["inference_logprobs"]) == 2
    assert all(len(t) == len(m) for t, m in zip(group["tokens"], group["masks"]))
    html = out.with_suffix(".html").read_text()
    assert "echo step-1" in html and "Reward:" in html, "the HTML shows the conversation and its score"
    # Atropos' viewer reads the file the same way a second time
    again = generate_html(str(out), str(tmp_path / "again.html"))
    assert Path(again or tmp_path / "again.html").read_text().count("reward-") >= 2


SWE_ITEMS = ("pypi__idna-3.10.swap_arguments__5eab2555", "pypi__idna-3.10.change_operator__ef8a45be")
"""Two idna instances: 32 tests each, the quickest of the shipped set to grade."""


async def test_process_runs_swe_smith_on_two_items(
    settings: Settings, worker, smol: str, smollm2_server: GenerateServerProcess, tmp_path: Path
) -> None:
    """`process --env.task_env swe_smith` on two items: each group's rollouts set up a real slot from
    the container's repository cache, play the reference patch (the demo policy steering SmolLM2) and
    are graded by pytest in the slot, so every score is 1.0."""
    from envs.swe_smith.config import SHIPPED_INSTANCES

    dataset = tmp_path / "two.jsonl"
    chosen = [
        line
        for line in Path(SHIPPED_INSTANCES).read_text().splitlines()
        if json.loads(line)["instance_id"] in SWE_ITEMS
    ]
    dataset.write_text("\n".join(chosen) + "\n")
    out = tmp_path / "out" / "swe.jsonl"
    proc = run_env(
        "process",
        settings,
        smollm2_server.tokenizer_dir,
        tmp_path,
        "--env.task_env",
        "swe_smith",
        env_config={"dataset": str(dataset), "shuffle": False},
        total_steps=2,
        group_size=2,
        max_agent_turns=5,
        ensure_scores_are_not_same=False,
        data_path_to_save_groups=str(out),
    )
    await finish(proc, tmp_path, "process")
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == 2, (tmp_path / "process.log").read_text()[-3000:]
    for group in groups:
        assert group["scores"] == [1.0, 1.0], group["scores"]
        assert len(group["tokens"]) == len(group["masks"]) == 2
        assert all(len(t) == len(m) for t, m in zip(group["tokens"], group["masks"]))
    played = [group["metadata"]["item_id"] for group in groups]
    assert sorted(played) == sorted(SWE_ITEMS), played  # both groups run at once; each is written as it ends
    for group in groups:  # each rollout made the reference's three tool calls, the last applying the patch
        assert group["group_overrides"]["tool_stats"]["executed_ok"] == 6, group["group_overrides"]
        assert all(override["stop_reason"] == "completed" for override in group["overrides"])
        assert "git apply" in json.dumps(group["messages"])
    assert out.with_suffix(".html").read_text().count("Reward:") >= 4


async def test_evaluate_writes_metrics(
    settings: Settings, worker, smol: str, smollm2_server: GenerateServerProcess, tmp_path: Path
) -> None:
    evals = tmp_path / "evals"
    proc = run_env(
        "evaluate", settings, smollm2_server.tokenizer_dir, tmp_path, data_dir_to_save_evals=str(evals), eval_items=2
    )
    await finish(proc, tmp_path, "evaluate")
    metrics = json.loads((evals / "metrics.json").read_text())
    (task,) = [k for k in metrics["results"] if k != "all"]
    result = metrics["results"][task]
    assert result["eval/completed"] + result["eval/failed"] == 2
    assert 0.0 <= result["eval/mean_score"] <= 1.0
    samples = [json.loads(line) for line in (evals / "samples.jsonl").read_text().splitlines()]
    assert len(samples) == result["eval/completed"]


@pytest.fixture
def demo_sft(
    settings: Settings, demo_policy, smollm2_tokenizer, smollm2_server: GenerateServerProcess
) -> Iterator[str]:
    """The demo policy (chat) with a local tokenizer: template-rendered tokens and masks, no logprobs."""
    from temporal_rollouts.core.settings import ChatPolicy

    settings.policies["demo-sft"] = ChatPolicy(
        base_url=f"{demo_policy.url}/v1",
        model="demo-policy",
        tokenizer=str(smollm2_server.tokenizer_dir),
        chat_template=str(TEMPLATES / "qwen2_5.jinja"),
    )
    yield "demo-sft"
    settings.policies.pop("demo-sft", None)


async def process_terminal_tasks(settings: Settings, tokenizer: Path, tmp_path: Path, policy: str, steps: int) -> list:
    """`process` over terminal_tasks with a chat policy: its groups, each scored 1.0 by the demo policy, with
    template-rendered tokens and masks (the assistant's turns trainable) and no logprobs."""
    out = tmp_path / "out" / f"{policy}.jsonl"
    proc = run_env(
        "process",
        settings,
        tokenizer,
        tmp_path,
        policy=policy,
        total_steps=steps,
        task_env="terminal_tasks",
        env_config={},
        max_agent_turns=10,
        data_path_to_save_groups=str(out),
    )
    await finish(proc, tmp_path, "process")
    groups = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(groups) == steps
    for group in groups:
        assert group["scores"] == [1.0, 1.0]
        assert all(len(t) == len(m) > 0 for t, m in zip(group["tokens"], group["masks"]))
        assert any(m != IGNORE_INDEX for mask in group["masks"] for m in mask), "the assistant's turns are trainable"
        assert group["inference_logprobs"] is None, "a chat policy gives no logprobs"
    return groups


async def test_process_with_the_demo_policy_and_a_local_tokenizer_runs_to_its_end(
    settings: Settings, worker, demo_sft: str, smollm2_server: GenerateServerProcess, tmp_path: Path
) -> None:
    await process_terminal_tasks(settings, smollm2_server.tokenizer_dir, tmp_path, demo_sft, steps=2)


async def test_serve_with_a_policy_that_gives_no_tokens_fails_at_once_in_one_line(
    settings: Settings, tmp_path: Path
) -> None:
    """Neither the policy nor `--env.tokenizer_name` names a tokenizer (its default is the policy's own)."""
    proc = run_env("serve", settings, Path("policy"), tmp_path, policy="demo")
    code = await asyncio.to_thread(proc.wait, 120)
    output = (tmp_path / "serve.log").read_text()
    assert code != 0, output[-2000:]
    assert output.strip().splitlines()[-1] == (
        "error: policy 'demo' names no tokenizer: give it one (policies.demo.tokenizer, a local folder) "
        "or pass --env.tokenizer_name"
    )


async def test_process_makes_tokens_with_env_tokenizer_name_when_the_policy_gives_none(
    settings: Settings, worker, smollm2_server: GenerateServerProcess, smollm2_tokenizer, tmp_path: Path
) -> None:
    """The demo policy names no tokenizer; `--env.tokenizer_name` gives one, whose chat template (SmolLM2's,
    with its tools template found by itself) renders the groups' tokens and masks. It asked for
    `policies.demo.tokenizer` instead."""
    [group] = await process_terminal_tasks(settings, smollm2_server.tokenizer_dir, tmp_path, "demo", steps=1)
    assert "<tool_call>" in smollm2_tokenizer.decode(group["tokens"][0])


async def test_a_killed_env_process_loses_nothing_and_its_restart_attaches_to_the_run(
    settings: Settings, parts: Parts, client, smol: str, smollm2_server: GenerateServerProcess, tmp_path: Path
) -> None:
    """SIGKILL `serve` while its groups are in flight: the run goes on without it, a new `serve` with
    the same run name attaches instead of starting another, and every group started is posted."""
    from temporal_rollouts.core.feed import FeedStatus

    run = f"env-kill-{uuid.uuid4().hex[:6]}"
    run_api = RunApiProcess(tmp_path / "run_api.log")
    run_api.start()
    try:
        async with TrajectoryApi(run_api.url) as api:
            await register_trainer(api, batch_size=4, max_token_len=4096, checkpoint_dir=tmp_path)
            fields = {
                "rollout_server_url": run_api.url,
                "run_name": run,
                "total_steps": 2,
                "max_staleness": 1,
                "env_config": {"steps": 1, "sleep_s": 3},
            }
            first = run_env("serve", settings, smollm2_server.tokenizer_dir, tmp_path, **fields)
            handle = client.get_workflow_handle(run)

            async def status() -> FeedStatus:
                return FeedStatus.model_validate(await handle.query("status"))

            for _ in range(600):
                try:
                    if (await status()).rollouts_running > 0:
                        break
                except Exception:  # noqa: BLE001  (not started yet)
                    pass
                await asyncio.sleep(0.2)
            first.send_signal(signal.SIGKILL)
            first.wait(10)
            in_flight = await status()
            assert in_flight.rollouts_running > 0, "the run keeps going without its env process"
            second = run_env("serve", settings, smollm2_server.tokenizer_dir, tmp_path, **fields)
            batches = [await pull_batch(api, timeout_s=ENV_WAIT_S) for _ in range(2)]
            await finish(second, tmp_path, "serve")
        done = await status()
    finally:
        run_api.stop()
    assert "attached to the running training run" in (tmp_path / "serve.log").read_text()
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{run}'")]
    assert len({w.run_id for w in runs}) >= 1 and len({w.id for w in runs}) == 1, "one run, not a second one"
    figures = done.figures
    assert figures.groups_started == figures.groups_posted and figures.dropped == {}, figures
    assert sum(len(batch) for batch in batches) == 4
    rollouts = [
        w async for w in client.list_workflows(f"RolloutBatchId = '{run}' AND WorkflowType = 'TrajectoryWorkflow'")
    ]
    assert len({w.id for w in rollouts}) == figures.rollouts_started - figures.rollouts_retried, "no rollout orphaned"
