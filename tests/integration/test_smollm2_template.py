"""SmolLM2's real tokenizer, loaded as a policy names it (a folder, no `chat_template`), renders a
conversation with tool calls through the packaged tool template, where its own template fails."""

from __future__ import annotations

from pathlib import Path

import pytest

from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall
from temporal_rollouts.llm.templates import ChatTemplate
from temporal_rollouts.tools.catalogue import tool_specs

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tokenizer_folder(smollm2_gguf: Path, tmp_path_factory) -> Path:
    from temporal_rollouts.policy_servers import smollm2

    return smollm2.export_tokenizer(tmp_path_factory.mktemp("tokenizer"), smollm2_gguf)


CALL = ToolCall(id="c1", function=FunctionCall(name="write_file", arguments='{"path": "a.txt", "content": "x"}'))
CONVERSATION = [
    Message(role="system", content="Solve it."),
    Message(role="user", content="Write x to a.txt."),
    Message(role="assistant", tool_calls=[CALL]),
    Message(role="tool", tool_call_id="c1", content="ok"),
]


def test_a_smollm2_policy_without_a_chat_template_renders_tools_and_calls(tokenizer_folder: Path) -> None:
    template = ChatTemplate.load(str(tokenizer_folder))
    text = template.render(CONVERSATION, tool_specs(["write_file"]), add_generation_prompt=True)
    assert "\n- write_file(path, content): " in text
    assert '<tool_call>\n{"name": "write_file", "arguments": {"path": "a.txt", "content": "x"}}\n</tool_call>' in text
    assert text.endswith("<|im_start|>assistant\n") and template.stop_token_ids


def test_its_own_template_cannot_render_a_tool_call(tokenizer_folder: Path) -> None:
    from transformers import AutoTokenizer

    own = ChatTemplate(AutoTokenizer.from_pretrained(tokenizer_folder))
    with pytest.raises(Exception, match="content|NoneType|Undefined"):
        own.render(CONVERSATION, tool_specs(["write_file"]), add_generation_prompt=True)


def test_a_named_chat_template_still_wins(tokenizer_folder: Path, tmp_path: Path) -> None:
    mine = tmp_path / "mine.jinja"
    mine.write_text("{% for m in messages %}[{{ m.role }}]{% endfor %}")
    text = ChatTemplate.load(str(tokenizer_folder), str(mine)).render(CONVERSATION, [], add_generation_prompt=False)
    assert text == "[system][user][assistant][tool]"
