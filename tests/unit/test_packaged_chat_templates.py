"""A tokenizer whose own chat template renders no tools gets the packaged one that does, without a flag:
SmolLM2's own template drops the tools and fails on every assistant turn that calls one (jinja's
UndefinedError on `content`), so each model turn of a CPU training run failed until a user found
the template the GRPO example kept beside it. tests/integration/test_smollm2_template.py loads the
real tokenizer."""

from __future__ import annotations

from types import SimpleNamespace

from temporal_rollouts.llm.templates import PACKAGED_TEMPLATES, tool_template_for

SMOLLM2_OWN = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\n"
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""SmolLM2-135M-Instruct's own template, as its GGUF carries it."""


def test_smollm2s_own_template_gets_the_packaged_tool_template() -> None:
    assert tool_template_for(SimpleNamespace(chat_template=SMOLLM2_OWN)) == PACKAGED_TEMPLATES / "smollm2_tools.jinja"
    assert (PACKAGED_TEMPLATES / "smollm2_tools.jinja").is_file()


def test_a_template_that_renders_tools_or_another_models_is_left_alone() -> None:
    assert tool_template_for(SimpleNamespace(chat_template=SMOLLM2_OWN.replace("messages", "tools"))) is None
    assert tool_template_for(SimpleNamespace(chat_template="{{ messages }}")) is None
    assert tool_template_for(SimpleNamespace(chat_template=None)) is None
