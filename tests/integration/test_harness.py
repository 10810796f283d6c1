"""Agent harnesses in the slot: the minimal one and mini-swe-agent solve a terminal task, each model call
a step of the rollout; and what a harness tries against its endpoint, the network and its limits."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import textwrap
import uuid
from urllib.parse import urlsplit

import httpx
import pytest
from temporalio.client import Client

from temporal_rollouts.core.harness import MINIMAL, HarnessSpec
from temporal_rollouts.core.records import RolloutLimits, Sampling, StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.worker import Parts
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.core.token_trace import IGNORE_INDEX
from temporal_rollouts.storage.transcripts import TranscriptStore
from tests.integration.test_resume import failed_result, rollouts_cli
from tests.integration.test_token_rollout import served
from tests.support.servers.fixtures import GenerateServerProcess, generate_policy
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.integration.test_crash import _in_phase, crash_settings, worker_process  # noqa: F401, F811  (fixtures)
from tests.support.processes import WorkerProcess
from tests.support.replay import sandboxed_replay_failure
from tests.support.waiting import leased_slots, no_leases, wait_until
from workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.slow

TASK = "csv-to-json"


async def run(client: Client, settings: Settings, input: TrajectoryInput) -> TrajectoryResult:
    return await client.execute_workflow(
        TrajectoryWorkflow.run, input, id=f"harness-{uuid.uuid4().hex[:8]}", task_queue=settings.temporal.task_queue
    )


async def test_the_minimal_harness_solves_a_task_one_step_per_call(
    client: Client, settings: Settings, pool: SandboxPool, transcripts: TranscriptStore, demo_policy: DemoPolicyProcess
) -> None:
    result = await run(client, settings, TrajectoryInput(env="terminal_tasks", item=Item(id=TASK), harness="minimal"))
    assert result.stop_reason is StopReason.COMPLETED and result.score == 1.0, result.stop_detail
    harness = result.harness
    assert harness is not None and harness.exit is not None
    assert (harness.exit.exit_code, harness.exit.stopped) == (0, False)
    assert "Done." in harness.exit.stdout_tail
    assert harness.calls == result.turns == len(result.policy_versions) >= 2 and harness.rewrites == 0
    messages = await transcripts.load(result.transcript)
    assert messages[0].role == "system" and "bash tool" in messages[0].content, "the harness's own conversation"
    assert [m.role for m in messages].count("assistant") == result.turns
    assert messages[-1].role == "assistant" and messages[-1].content == "Done."
    turns = next(iter(demo_policy.stats()["conversations"].values()))
    assert turns == list(range(result.turns)), "each call was sent to the model once"
    assert await leased_slots(pool) == []
    # The harness loop is workflow code: its history replays under the sandboxed runner, deterministically.
    assert (failure := await sandboxed_replay_failure(client, result.rollout_id)) is None, failure


async def test_mini_swe_agent_from_pypi_solves_a_task(
    client: Client, settings: Settings, transcripts: TranscriptStore
) -> None:
    result = await run(
        client, settings, TrajectoryInput(env="terminal_tasks", item=Item(id=TASK), harness="mini-swe-agent")
    )
    assert result.stop_reason is StopReason.COMPLETED and result.score == 1.0, result.stop_detail
    assert result.harness is not None and result.harness.exit is not None and result.harness.exit.exit_code == 0
    messages = await transcripts.load(result.transcript)
    assert "Please solve this issue" in messages[1].content
    calls = [json.loads(c.function.arguments)["command"] for m in messages for c in m.tool_calls or []]
    assert calls[-1] == "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT", "it ended as its prompt says"


ATTACK = textwrap.dedent(
    """\
    import json, os, socket, sys, threading, urllib.request, urllib.error
    base = os.environ["OPENAI_BASE_URL"]
    def status(key, body=b'{"messages": [{"role": "user", "content": "hi"}]}'):
        request = urllib.request.Request(base + "/chat/completions", data=body, method="POST")
        request.add_header("Content-Type", "application/json")
        if key is not None:
            request.add_header("Authorization", "Bearer " + key)
        try:
            return urllib.request.urlopen(request, timeout=120).status
        except urllib.error.HTTPError as err:
            return err.code
        except Exception as err:
            return type(err).__name__
    def reach(host, port):
        try:
            socket.create_connection((host, port), timeout=3).close()
            return "reached"
        except OSError as err:
            return type(err).__name__
    # Listening unix sockets of the slot's network namespace (flag __SO_ACCEPTCON). A connection the
    # slot made to its own endpoint shows there too, under the endpoint's path, as a connected socket.
    rows = [line.split() for line in open("/proc/net/unix").read().splitlines()[1:]]
    listening = [f for f in rows if len(f) == 8 and int(f[3], 16) & 0x10000]
    found = {
        "no_key": status(None),
        "wrong_key": status("not-the-key"),
        "network": {target: reach(*target.rsplit(":", 1)) for target in os.environ["TARGETS"].split()},
        "visible": sorted(os.listdir("/run/rollouts")),
        "other_sockets": [f[-1] for f in listening if f[-1].startswith("/")],
    }
    print(json.dumps(found), flush=True)
    statuses = []
    def flood(i):
        body = json.dumps({"messages": [{"role": "user", "content": f"spam {i}"}]}).encode()
        statuses.append(status(os.environ["OPENAI_API_KEY"], body))
    threads = [threading.Thread(target=flood, args=(i,)) for i in range(40)]
    for t in threads: t.start()
    for t in threads: t.join()
    print(json.dumps({"flood": statuses}), flush=True)
    # However many of the flood got through, it then asks one call at a time until its budget stops it.
    for i in range(10):
        body = json.dumps({"messages": [{"role": "user", "content": f"one more {i}"}]}).encode()
        print(json.dumps({"after": status(os.environ["OPENAI_API_KEY"], body)}), flush=True)
    """
)


async def test_a_harness_reaches_only_its_own_endpoint_and_cannot_pass_its_limits(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess
) -> None:
    temporal = settings.temporal.address
    policy = urlsplit(settings.demo_policy_url)
    sandbox = urlsplit((await pool.fleet.refresh())[0].url)
    targets = [temporal, f"{policy.hostname}:{policy.port}", f"{sandbox.hostname}:{sandbox.port}"]
    spec = HarnessSpec(
        name="attack",
        command=f"python3 -I - <<'ATTACK'\n{ATTACK}ATTACK\n",
        env={"TARGETS": " ".join(targets)},
    )
    limits = RolloutLimits(max_turns=3)
    result = await run(
        client, settings, TrajectoryInput(env="terminal_tasks", item=Item(id=TASK), harness=spec, limits=limits)
    )
    assert result.stop_reason is StopReason.MAX_TURNS and result.turns == 3, result.stop_detail
    assert result.harness is not None and result.harness.exit is not None and result.harness.exit.stopped
    printed = [json.loads(line) for line in result.harness.exit.stdout_tail.splitlines()]
    found = printed[0]
    assert found["no_key"] == 401 and found["wrong_key"] == 401, found
    assert all(outcome != "reached" for outcome in found["network"].values()), found["network"]
    assert found["visible"] == ["model.sock", "relay.py", "task.md"]
    assert found["other_sockets"] == [], "no other endpoint is in the slot's view"
    # Four of the flood held at once stop the rollout mid-flood; where a loaded machine let fewer through
    # (uvicorn refuses past 16 open connections), the flood ended, and only refusals and its share were answered.
    for flood in [line["flood"] for line in printed if "flood" in line]:
        assert len(flood) == 40 and set(flood) <= {200, 429, 503} and flood.count(200) <= 3, flood
    asked = demo_policy.stats()["conversations"].values()
    assert sum(len(turns) for turns in asked) == 3, "40 requests, and the model was asked 3 times"
    assert await leased_slots(pool) == []


async def test_a_worker_killed_mid_call_costs_the_harness_only_time(
    client: Client,
    crash_settings: Settings,  # noqa: F811
    worker_process: WorkerProcess,  # noqa: F811
    demo_policy: DemoPolicyProcess,
    pool: SandboxPool,
) -> None:
    """SIGKILL the worker while the harness's second call is with the model: the harness (which would fail
    on any error, its client's retries off) gets its answer from the next worker, no finished call is sent
    to the model again, and the harness is never started again."""
    demo_policy.control(delay_s=4.0)
    spec = MINIMAL.model_copy(update={"env": {"MINIMAL_HARNESS_MAX_RETRIES": "0"}})
    handle = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="terminal_tasks", item=Item(id=TASK), harness=spec),
        id=f"harness-crash-{uuid.uuid4().hex[:6]}",
        task_queue=crash_settings.temporal.task_queue,
    )
    await wait_until(lambda: _in_phase(handle, "turn 2"), timeout_s=120, interval_s=0.05)
    await asyncio.sleep(1.0)
    worker_process.restart()
    result = TrajectoryResult.model_validate(await asyncio.wait_for(handle.result(), 120))
    assert result.stop_reason is StopReason.COMPLETED and result.score == 1.0, result.stop_detail
    assert result.harness is not None and result.harness.starts == 1 and result.harness.exit.exit_code == 0
    turns = next(iter(demo_policy.stats()["conversations"].values()))
    # The call in flight when the worker died is sent again by the retried step (its answer died with the
    # worker), as for our own turns; every finished one is in the history and never sent again.
    assert turns == sorted(turns) and set(turns) == set(range(result.turns)), turns
    assert len(turns) - result.turns <= 1, f"a finished call went to the model again: {turns}"
    assert result.harness.calls == result.turns, "one recorded turn per harness request"
    await wait_until(lambda: no_leases(pool), timeout_s=15)


TOKEN_CALLS = textwrap.dedent(
    """\
    import json, os, urllib.request
    def ask(messages):
        request = urllib.request.Request(
            os.environ["OPENAI_BASE_URL"] + "/chat/completions",
            data=json.dumps({"model": os.environ["ROLLOUTS_MODEL"], "messages": messages}).encode(),
            headers={"Content-Type": "application/json", "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]},
        )
        reply = json.load(urllib.request.urlopen(request, timeout=300))["choices"][0]["message"]
        return {"role": "assistant", "content": reply["content"]}
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Name a colour."}]
    messages += [ask(messages), {"role": "user", "content": "Another one."}]
    messages.append(ask(messages))  # extends: the reply echoed back, then a new user message
    ask([messages[0], {"role": "user", "content": "In short: name a colour."}])  # rewrites (summarised history)
    """
)


@pytest.mark.timeout(600)
async def test_a_harness_on_a_token_policy_extends_one_sequence_and_a_rewrite_starts_another(
    client: Client, settings: Settings, parts: Parts, smollm2_server: GenerateServerProcess
) -> None:
    """With an SGLang-shaped policy (the real SmolLM2 server), a call that extends the conversation continues
    the token sequence the previous call left, and one that rewrites history starts a new one, counted."""
    settings.policies["smol-harness"] = generate_policy(smollm2_server).model_copy(update={"prefill_from": None})
    httpx.post(f"{smollm2_server.url}/requests/reset", timeout=10).raise_for_status()
    try:
        spec = HarnessSpec(name="token-calls", command=f"python3 -I - <<'CALLS'\n{TOKEN_CALLS}CALLS\n")
        result = await run(
            client,
            settings,
            TrajectoryInput(
                env="terminal_tasks",
                item=Item(id=TASK),
                harness=spec,
                policy="smol-harness",
                sampling=Sampling(temperature=1.0, max_tokens=8),
            ),
        )
    finally:
        settings.policies.pop("smol-harness", None)
    assert result.stop_reason is StopReason.COMPLETED, result.stop_detail
    assert result.harness is not None and (result.harness.calls, result.harness.rewrites) == (3, 1)
    assert result.turns == 3 and result.tokens is not None and result.tokens.restarts == 1
    first, second, third = served(smollm2_server)
    assert second["input_ids"][: len(first["input_ids"]) + len(first["output_ids"])] == (
        first["input_ids"] + first["output_ids"]
    ), "the second call continues the first call's tokens"
    assert third["input_ids"] != second["input_ids"][: len(third["input_ids"])], "the rewrite starts afresh"
    trace = await parts.traces.load(result.tokens)
    start = len(third["input_ids"])
    generated = range(start, start + len(third["output_ids"]))
    assert trace.tokens[:start] == third["input_ids"], "the trainer gets the last sequence"
    assert trace.tokens[start : generated.stop] == third["output_ids"]
    assert [i for i, m in enumerate(trace.masks()) if m != IGNORE_INDEX] == list(generated)


async def test_a_dead_sandbox_server_fails_the_rollout_and_resume_starts_the_harness_again(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess, pool: SandboxPool
) -> None:
    """SIGKILL the sandbox server (its harness dies with it) after the harness's first answered call: the
    rollout fails as `sandbox_error` with its workspace saved, and `rollouts resume` starts the harness again
    on the saved files, its turns counted on from the first run's."""
    demo_policy.control(delay_s=1.0)
    rollout = f"harness-resume-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="terminal_tasks", item=Item(id=TASK), harness="minimal"),
        id=rollout,
        task_queue=settings.temporal.task_queue,
    )

    async def a_call_answered() -> bool:
        return (await handle.query("progress"))["turns"] >= 1

    await wait_until(a_call_answered, timeout_s=120, interval_s=0.05)
    for container in await pool.fleet.refresh():
        assert container.pid is not None
        os.kill(container.pid, signal.SIGKILL)
    failed = await failed_result(client, rollout)
    assert failed.stop_reason is StopReason.SANDBOX_ERROR and failed.snapshot, failed.stop_detail
    assert failed.harness is not None and failed.harness.starts == 1 and failed.turns >= 1

    demo_policy.reset()
    resumed = await rollouts_cli(settings, "resume", rollout, "--json")
    assert resumed["resumed_from_run"] == handle.result_run_id
    result = TrajectoryResult.model_validate(await client.get_workflow_handle(rollout).result())
    assert result.stop_reason is StopReason.COMPLETED and result.score == 1.0, result.stop_detail
    assert result.harness is not None and result.harness.starts == 2 and result.harness.exit.exit_code == 0
    assert result.turns > failed.turns and len(result.policy_versions) == result.turns, "turns count on"
    await wait_until(lambda: no_leases(pool), timeout_s=15)


async def test_a_harness_that_exits_non_zero_fails_the_rollout_unscored_with_its_output_kept(
    client: Client, settings: Settings, pool: SandboxPool
) -> None:
    spec = HarnessSpec(name="broken", command="echo started; echo 'no such model' >&2; exit 3")
    rollout = f"harness-broken-{uuid.uuid4().hex[:6]}"
    await client.start_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="terminal_tasks", item=Item(id=TASK), harness=spec),
        id=rollout,
        task_queue=settings.temporal.task_queue,
    )
    failed = await failed_result(client, rollout)
    assert failed.stop_reason is StopReason.HARNESS_FAILED and "no such model" in failed.stop_detail
    assert failed.harness is not None and failed.harness.exit is not None
    assert (failed.harness.exit.exit_code, failed.harness.exit.stopped) == (3, False)
    assert (failed.harness.exit.stdout_tail, failed.harness.exit.stderr_tail) == ("started\n", "no such model\n")
    assert failed.turns == 0 and not failed.verify_details, "a broken harness is not verified: no score"
    await wait_until(lambda: no_leases(pool), timeout_s=15)
