"""The `write_word` env graded through the real sandbox server: each shaped reward for the
workspace that earns it, written with the same `write_file` tool the model calls; and whole
rollouts through the worker with the demo policy."""

from __future__ import annotations

import uuid

import pytest
from temporalio.client import Client

from envs import get_env
from temporal_rollouts.core.errors import BadItem, ConfigError
from temporal_rollouts.core.records import BatchInput, RolloutLimits
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder
from tests.support.sandbox import needs_bubblewrap
from tests.support.waiting import batch_id
from workflows.batch import BatchWorkflow

pytestmark = [pytest.mark.slow, needs_bubblewrap]

ITEM = Item(id="answer-apple")


@pytest.mark.parametrize(
    "files, commands, score",
    [
        ({"answer.txt": "apple"}, [], 1.0),
        ({"answer.txt": "apple\n"}, [], 1.0),
        ({"answer.txt": "Apple"}, [], 0.5),
        ({"answer.txt": "apple\napple\n"}, [], 0.5),
        ({"answer.txt": ""}, [], 0.5),
        ({"notes.txt": "apple"}, [], 0.25),
        ({"deep/answer.txt": "apple"}, [], 0.25),
        ({"real.txt": "apple"}, ["ln -s real.txt answer.txt"], 0.25),
        ({}, ["mkdir answer.txt"], 0.0),
        ({}, [], 0.0),
    ],
)
async def test_the_grader_scores_what_the_workspace_holds(
    pool: SandboxPool, files: dict[str, str], commands: list[str], score: float
) -> None:
    env = get_env("write_word")
    run = uuid.uuid4().hex[:8]
    lease = await pool.acquire(Holder(workflow_id=f"write-word-{run}"), ttl_s=120, wait_s=60)
    try:
        meta = await env.setup_workspace(ITEM, LeasedSlot(pool, lease, f"{run}/setup"))
        agent = LeasedSlot(pool, lease, f"{run}/tools")
        for path, content in files.items():
            assert (await agent.write_file(path, content)).ok
        for command in commands:
            assert (await agent.terminal(command)).ok
        verdict = await env.verify(ITEM, LeasedSlot(pool, lease, f"{run}/verify", meta=meta), [])
    finally:
        await pool.release(lease)
    assert verdict.score == score, verdict.details


def test_items_prompts_and_config() -> None:
    env = get_env("write_word")
    items = env.load_items(3, offset=env.item_count() - 1)
    assert [item.id for item in items] == ["note-bridge", "answer-apple", "word-river"], "the task set cycles"
    assert len({item.id for item in env.load_items(env.item_count())}) == 64, "every (file, word) pair once"
    messages = env.prompt_messages(ITEM)
    assert [m.role for m in messages] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert messages[-1].content == "Create the file answer.txt containing the word apple."
    assert messages[2].tool_calls[0].function.name == "write_file"
    assert [m.role for m in get_env("write_word", {"examples": 0}).prompt_messages(ITEM)] == ["system", "user"]
    assert env.reference_solution(ITEM)[0][0].arguments == {"path": "answer.txt", "content": "apple"}
    with pytest.raises(BadItem, match="no task 'answer-kiwi'"):
        env.format_prompt(Item(id="answer-kiwi"))
    with pytest.raises(ConfigError, match="examples"):
        get_env("write_word", {"examples": 3})


async def test_the_reference_call_scores_one_through_the_worker(client: Client, settings: Settings) -> None:
    result = await client.execute_workflow(
        BatchWorkflow.run,
        BatchInput(
            env="write_word", env_config={"examples": 0}, num_items=3, group_size=1, limits=RolloutLimits(max_turns=1)
        ),
        id=batch_id("write-word"),
        task_queue=settings.temporal.task_queue,
    )
    assert (result.completed, result.mean_score, result.stop_reasons) == (3, 1.0, {"max_turns": 3})
