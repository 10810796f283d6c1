"""A chat policy configured with a tokenizer writes groups with real token ids and masks
(for SFT): the conversation rendered with the model's chat template, the assistant's turns
trainable and the rest masked. Real batch on the dev server with the demo policy as the chat
endpoint and SmolLM2's tokenizer (exported from its GGUF, offline)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import ChatPolicy, Settings
from temporal_rollouts.core.token_trace import IGNORE_INDEX
from temporal_rollouts.llm.templates import ChatTemplate
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support import TEMPLATES
from tests.support.waiting import batch_id
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow


async def test_a_chat_policy_with_a_tokenizer_writes_sft_tokens(
    client: Client, settings: Settings, tmp_path: Path, monkeypatch, smollm2_tokenizer_dir: Path
) -> None:
    tokenizer = str(smollm2_tokenizer_dir)
    chat_template = str(TEMPLATES / "qwen2_5.jinja")
    monkeypatch.setitem(
        settings.policies,
        "demo-sft",
        ChatPolicy(
            base_url=settings.demo_policy_url,
            model="demo-policy",
            timeout_s=60,
            tokenizer=tokenizer,
            chat_template=chat_template,
        ),
    )
    result = BatchResult.model_validate(
        await client.execute_workflow(
            BatchWorkflow.run,
            BatchInput(env="terminal_tasks", num_items=1, group_size=2, policy="demo-sft"),
            id=batch_id("sft"),
            task_queue=settings.temporal.task_queue,
        )
    )
    assert result.completed == 2
    [group] = read_groups(Path(result.output))
    template = ChatTemplate.load(tokenizer, chat_template)
    for tokens, masks, conversation in zip(group["tokens"], group["masks"], group["messages"]):
        assert len(tokens) == len(masks) > 100
        trained = [t for t in masks if t != IGNORE_INDEX]
        assert 0 < len(trained) < len(tokens) / 2
        assert all(m in (IGNORE_INDEX, t) for t, m in zip(tokens, masks))
        everything, learned = template.decode(tokens), template.decode(trained)
        prompt = conversation[1]["content"][:60]
        assert prompt in everything and prompt not in learned  # the task is read, not trained on
        calls = [
            c["function"]["name"] for m in conversation if m["role"] == "assistant" for c in m.get("tool_calls") or []
        ]
        assert calls and all(name in learned for name in calls)  # the assistant's tool calls are trained on
        last_reply = conversation[-1]["content"]
        assert conversation[-1]["role"] == "assistant" and last_reply.strip()[:30] in learned
