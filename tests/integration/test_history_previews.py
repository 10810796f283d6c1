"""In the Temporal UI each step of a rollout shows a short preview: a model turn's result the
start of the reply and the tools it calls, a tool call's result the tool, its arguments and
the exit code. Read here from the real history of a rollout on the dev server."""

from __future__ import annotations

import json

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from activities.llm import REPLY_PREVIEW_CHARS
from activities.tools import ARGUMENTS_PREVIEW_CHARS
from envs.registry import get_env
from temporal_rollouts.core.records import TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from tests.support.waiting import batch_id
from workflows.trajectory import TrajectoryWorkflow

pytestmark = pytest.mark.slow


def _json_payloads(event) -> list[dict]:
    if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
        payloads = event.activity_task_completed_event_attributes.result.payloads
    elif event.event_type == EventType.EVENT_TYPE_MARKER_RECORDED:  # local activities (tool calls)
        details = event.marker_recorded_event_attributes.details
        payloads = details["result"].payloads if "result" in details else []
    else:
        return []
    found = []
    for payload in payloads:
        try:
            value = json.loads(payload.data)
        except ValueError:
            continue
        if isinstance(value, dict):
            found.append(value)
    return found


async def test_each_step_carries_a_short_human_preview(client: Client, settings: Settings) -> None:
    item = get_env("terminal_tasks").load_items(1)[0]
    rollout = batch_id("preview")
    result = TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(env="terminal_tasks", item=item),
            id=rollout,
            task_queue=settings.temporal.task_queue,
        )
    )
    assert result.score == 1.0 and result.tool_calls >= 1
    history = await client.get_workflow_handle(rollout).fetch_history()
    results = [value for event in history.events for value in _json_payloads(event)]
    turns = [r for r in results if "assistant" in r and "calls" in r]
    tools = [r for r in results if "replayed" in r and "transcript" in r]
    assert len(turns) == result.turns and len(tools) == result.tool_calls
    calling = [t for t in turns if t["calls"]]
    assert calling and all(t["tools_called"] and len(t["tools_called"]) == t["calls"] for t in calling)
    assert all(len(t.get("preview") or "") <= REPLY_PREVIEW_CHARS for t in turns)
    assert any(t.get("preview") for t in turns), turns
    for tool in tools:
        assert tool["name"] in calling[0]["tools_called"] or tool["name"]
        assert tool["arguments_preview"] and len(tool["arguments_preview"]) <= ARGUMENTS_PREVIEW_CHARS
    assert any(tool.get("exit_code") == 0 for tool in tools), tools
