"""One rollout at a time: stop reasons, slot release, a retried tool call that runs once, replay under the sandbox."""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from datetime import timedelta

import pytest
from temporalio import activity
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from activities.tools import ToolActivities, ToolCallInput, ToolCallResult
from temporal_rollouts.core.records import RolloutLimits, StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.storage.transcripts import TranscriptStore
from tests.support.sandbox import executions_under
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import leased_slots, no_leases, wait_until
from temporal_rollouts.runtime.worker import WORKFLOWS, Parts, build_activities
from workflows import params
from workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.slow

TASK = "csv-to-json"


def rollout(item: str = TASK, env: str = "terminal_tasks", **kwargs) -> TrajectoryInput:
    return TrajectoryInput(env=env, item=Item(id=item), **kwargs)


async def run(
    client: Client, settings: Settings, input: TrajectoryInput, task_queue: str | None = None
) -> TrajectoryResult:
    return await client.execute_workflow(
        TrajectoryWorkflow.run,
        input,
        id=f"rollout-{uuid.uuid4().hex[:8]}",
        task_queue=task_queue or settings.temporal.task_queue,
    )


async def run_failing(client: Client, settings: Settings, input: TrajectoryInput) -> TrajectoryResult:
    with pytest.raises(WorkflowFailureError) as caught:
        await run(client, settings, input)
    failure = caught.value.cause
    assert isinstance(failure, ApplicationError) and failure.type == "RolloutFailed"
    return TrajectoryResult.model_validate(failure.details[0])


async def test_rollout_records_turns_tools_and_timings(client: Client, settings: Settings, pool: SandboxPool) -> None:
    result = await run(client, settings, rollout())
    assert result.score == 1.0 and result.stop_reason is StopReason.COMPLETED
    assert result.turns >= 2 and result.tool_calls >= 2 and result.tool_errors == []
    assert result.tool_stats.attempted == result.tool_stats.executed_ok == result.tool_calls
    assert {"acquire", "setup", "llm", "tools", "verify", "total"} <= set(result.timings)
    assert result.verify_details["exit_code"] == 0
    assert await leased_slots(pool) == []


async def test_model_error_is_recorded_and_the_slot_released(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(fail_next=100, fail_status=400)
    result = await run_failing(client, settings, rollout())
    assert result.stop_reason is StopReason.MODEL_REJECTED
    assert "400" in result.stop_detail
    assert demo_policy.stats()["total"] == 1, "a 400 must not be retried"
    assert await leased_slots(pool) == []


async def test_model_outage_past_retries_fails_as_model_unavailable(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(fail_next=1000, fail_status=503, retry_after=0.05)
    result = await run_failing(client, settings, rollout())
    assert result.stop_reason is StopReason.MODEL_UNAVAILABLE
    assert demo_policy.stats()["total"] == 8, "every attempt of the retry policy, then stop"
    assert await leased_slots(pool) == []


async def test_a_transient_503_is_retried_and_the_rollout_completes(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(fail_next=2, fail_status=503, retry_after=0.05)
    result = await run(client, settings, rollout())
    assert result.score == 1.0 and result.stop_reason is StopReason.COMPLETED


async def test_garbage_reply_stops_with_malformed_reply(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(garbage_next=1)
    result = await run(client, settings, rollout())
    assert result.stop_reason is StopReason.MALFORMED_REPLY
    assert result.turns == 0 and result.score == 0.0
    assert await leased_slots(pool) == []


async def test_unknown_tool_is_answered_with_the_tool_list_and_recorded(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess, transcripts: TranscriptStore
) -> None:
    demo_policy.control(unknown_tool_next=1)
    result = await run(client, settings, rollout())
    assert [e.tool_name for e in result.tool_errors] == ["teleport"]
    assert "unknown_tool" in result.tool_errors[0].error
    stats = result.tool_stats
    assert (stats.attempted, stats.schema_valid) == (result.tool_calls, result.tool_calls - 1)
    assert (stats.executed_ok, stats.execution_errors) == (result.tool_calls - 1, 0)
    messages = await transcripts.load(result.transcript)
    reply = next(m for m in messages if m.role == "tool")
    assert "terminal" in reply.content and "write_file" in reply.content
    assert result.stop_reason is StopReason.COMPLETED and result.score == 1.0


async def test_broken_tool_call_json_is_answered_and_recorded(
    client: Client, settings: Settings, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(malformed_next=1)
    result = await run(client, settings, rollout())
    assert len(result.tool_errors) == 1 and "bad_arguments" in result.tool_errors[0].error
    assert result.tool_stats.attempted - result.tool_stats.schema_valid == 1
    assert result.stop_reason is StopReason.COMPLETED and result.score == 1.0


async def test_max_turns_stops_and_still_scores(client: Client, settings: Settings) -> None:
    result = await run(client, settings, rollout(limits=RolloutLimits(max_turns=1)))
    assert result.stop_reason is StopReason.MAX_TURNS and result.turns == 1
    assert result.score == 0.0 and "exit_code" in result.verify_details


async def test_bad_item_is_a_recorded_failure(client: Client, settings: Settings, pool: SandboxPool) -> None:
    result = await run_failing(client, settings, rollout(item="no-such-task"))
    assert result.stop_reason is StopReason.BAD_ITEM and "no-such-task" in result.stop_detail
    assert await leased_slots(pool) == []


async def test_cancel_releases_the_slot(
    client: Client, settings: Settings, pool: SandboxPool, demo_policy: DemoPolicyProcess
) -> None:
    demo_policy.control(delay_s=60)
    handle = await client.start_workflow(
        TrajectoryWorkflow.run, rollout(), id=f"rollout-{uuid.uuid4().hex[:8]}", task_queue=settings.temporal.task_queue
    )

    async def held_by_rollout():
        return [s for s in await leased_slots(pool) if s.lease.holder.workflow_id == handle.id]

    await wait_until(held_by_rollout)
    await asyncio.sleep(0.5)  # into the slow model turn
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):
        await handle.result()
    await wait_until(lambda: no_leases(pool), timeout_s=15)


async def test_tool_call_retried_after_timeout_is_not_executed_twice(
    client: Client, settings: Settings, parts: Parts, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first attempt runs the command, then its worker goes silent (no result), as if it
    hung; the local activity times out and Temporal retries it. The retry must be answered
    from the sandbox's stored result under the same call id: the sandbox's own log shows one
    execution."""
    monkeypatch.setattr(params, "TOOL_CALL_LOCAL", dataclasses.replace(params.TOOL_CALL_LOCAL, start_to_close_s=3))
    real = ToolActivities(parts.pool, parts.transcripts)
    attempts: list[tuple[str, int, bool, bool]] = []

    @activity.defn(name="tool_call")
    async def tool_call_that_loses_its_first_result(input: ToolCallInput) -> ToolCallResult:
        result = await real.tool_call(input)
        info = activity.info()
        attempts.append((input.call_key, info.attempt, info.is_local, result.replayed))
        if info.attempt == 1 and input.call_key.endswith("turn-1/call-0"):
            await asyncio.sleep(20)  # silent past the 3 s start-to-close timeout
        return result

    activities = [a for a in build_activities(client, parts) if a.__name__ != "tool_call"]
    task_queue = f"lossy-{uuid.uuid4().hex[:6]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[TrajectoryWorkflow],
        activities=[*activities, tool_call_that_loses_its_first_result],
        graceful_shutdown_timeout=timedelta(seconds=1),
        workflow_runner=UnsandboxedWorkflowRunner(),  # as workers run it; the sandbox would re-import params
    ):
        input = rollout(item="echo-1", env="echo_chain", env_config={"steps": 2})
        result = await run(client, settings, input, task_queue=task_queue)

    assert result.score == 1.0 and result.tool_calls == 2, "each step appended exactly once"
    first_call = [
        (attempt, local, replayed) for key, attempt, local, replayed in attempts if key.endswith("turn-1/call-0")
    ]
    assert first_call == [(1, True, False), (2, True, True)]
    executions = executions_under(settings.data_dir, f"{result.rollout_id}/")
    first = [e for e in executions if e["call_id"].endswith("turn-1/call-0")]
    assert len(first) == 1, executions


async def test_tool_calls_are_local_activities_that_leave_no_activity_events(
    client: Client, settings: Settings
) -> None:
    result = await run(client, settings, rollout(item="echo-2", env="echo_chain", env_config={"steps": 2}))
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    scheduled = [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in history.events
        if e.HasField("activity_task_scheduled_event_attributes")
    ]
    markers = [e for e in history.events if e.HasField("marker_recorded_event_attributes")]
    assert result.tool_calls == 2 and "tool_call" not in scheduled
    assert len(markers) >= 2, "each tool call's result is recorded as a local activity marker"


async def test_a_rollout_history_replays_under_the_workflow_sandbox(client: Client, settings: Settings) -> None:
    """Workers run workflow code unsandboxed (worker.sandboxed_workflows is off); replaying a
    real history under the sandboxed runner catches a non-deterministic call or a restricted
    import that a change let into workflow code."""
    result = await run(client, settings, rollout(item="echo-3", env="echo_chain", env_config={"steps": 2}))
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    replayer = Replayer(
        workflows=WORKFLOWS, workflow_runner=SandboxedWorkflowRunner(), data_converter=client.data_converter
    )
    replayed = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_oversized_verifier_details_fail_once_with_an_explanation(
    client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    from envs.echo_chain.env import EchoChainEnv
    from temporal_rollouts.core.tasks import Verdict

    async def chatty_verify(self, item, slot, transcript):
        return Verdict(score=1.0, details={"log": "x" * 3_000_000})

    monkeypatch.setattr(EchoChainEnv, "verify", chatty_verify)
    result = await run_failing(client, settings, rollout(item="echo-5", env="echo_chain", env_config={"steps": 1}))
    assert result.stop_reason is StopReason.ENV_ERROR
    assert "PayloadTooLarge" in result.stop_detail and "over the 1048576-byte limit" in result.stop_detail
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    verify_attempts = [
        e
        for e in history.events
        if e.HasField("activity_task_started_event_attributes") and e.activity_task_started_event_attributes.attempt > 1
    ]
    assert verify_attempts == [], "a payload that is too large is not retried"


async def test_what_setup_returns_reaches_the_verifier(
    client: Client, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The setup hook's metadata travels with the rollout to verify, as `slot.meta`."""
    from envs.echo_chain.env import EchoChainEnv
    from temporal_rollouts.core.tasks import Verdict

    marker = uuid.uuid4().hex
    original_setup = EchoChainEnv.setup_workspace

    async def setup_with_meta(self, item, slot):
        return {**await original_setup(self, item, slot), "marker": marker}

    async def verify_reads_meta(self, item, slot, transcript):
        return Verdict(score=1.0 if slot.meta.get("marker") == marker else 0.0, details={"seen": slot.meta})

    monkeypatch.setattr(EchoChainEnv, "setup_workspace", setup_with_meta)
    monkeypatch.setattr(EchoChainEnv, "verify", verify_reads_meta)
    result = await run(client, settings, rollout(item="echo-6", env="echo_chain", env_config={"steps": 1}))
    assert result.score == 1.0, result.verify_details
    assert result.setup_meta["marker"] == marker
