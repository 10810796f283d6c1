"""Tool-call parsers (llm.parsers): each family tested on the real rendered output of its
chat template, plus the awkward cases a sampled model produces.

Real templates (tests/data/templates/, provenance in SOURCES.md), rendered here with
jinja2 in the environment transformers' `apply_chat_template` uses (the test
`test_renderer_matches_transformers` checks that, where transformers is installed):

    hermes / qwen   Qwen2.5 and Qwen3 templates            (trl 1.16.0)
    qwen3_coder     Qwen3.5 and Qwen3.6 templates          (trl 1.16.0); they emit the same
                    <tool_call><function=...><parameter=...> format as Qwen3-Coder, whose own
                    template is in no package reachable offline
    llama3_json     Llama 3.1 and 3.2 templates            (trl 1.16.0)
    deepseek_v3     DeepSeek-V3 template                   (trl 1.16.0)
    mistral         [TOOL_CALLS][...] list form: Mistral v3 tekken and v2/v3 templates
                    (axolotl 0.19.0), and mistral-common 1.13.1's own tokenizers (v3, v7);
                    [TOOL_CALLS]name[ARGS]{...} form: mistral-common's v11 and v13 tokenizers
                    (mistral_common_rendered.json, made by render_mistral_common.py)
    deepseek_v31    no template found offline: tested against the format DeepSeek documents
                    for V3.1 (name<｜tool▁sep｜>{json}, no type and no code fence)

The generated text is taken the way a token-level client sees it: the render of the
conversation minus the render of the prompt with the generation prompt, up to and
including the end-of-turn token.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any

import pytest

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import ToolSpec
from temporal_rollouts.llm.parsers import (
    ParsedTurn,
    ToolCallParser,
    get_parser,
    make_call_id,
    parser_names,
    register_parser,
)
from temporal_rollouts.llm.parsers.base import _REGISTRY, RawCall
from tests.support import TEMPLATES
from tests.support.chat_templates import TOOLS, calls_of, compact, render

# ---------------------------------------------------------------------------- rendering


def generated_text(
    template: str,
    messages: list[dict],
    end: str,
    *,
    marker: str | None = None,
    tools: list[dict] | None = None,
    **extra: Any,
) -> str:
    """The last (assistant) message as the model generated it, end-of-turn token included.

    Without `marker`, the prompt render (with generation prompt) must be a prefix of the
    full render and the text is what follows it. Templates whose generation prompt is not
    a prefix of their assistant render (DeepSeek-V3 adds `<think>` to one only) take the
    text after the last `marker` (the assistant header) instead."""
    full = render(template, messages, tools=tools, **extra)
    if marker is None:
        prompt = render(template, messages[:-1], tools=tools, add_generation_prompt=True, **extra)
        assert full.startswith(prompt), "template is not prefix-preserving here"
        text = full[len(prompt) :]
    else:
        text = full[full.rindex(marker) + len(marker) :]
    return text[: text.index(end) + len(end)]


WEATHER = {"city": "Zürich", "unit": "celsius"}
SEARCH = {"query": 'a "quoted" <b>tag</b> & [bracket]', "filters": {"lang": "fr", "max": 3}}
WRITE = {
    "path": "src/app.py",
    "content": "def f():\n    return {'a': 1}\n",
    "overwrite": True,
    "retries": 3,
    "version": "3.10",
    "tags": ["a", "b"],
    "meta": {"k": [1, 2.5, None]},
}


USER = {"role": "user", "content": "What's the weather in Zürich? Then search for something."}


def tool_call(name: str, arguments: Any, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str | None, *calls: dict, reasoning: str | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


# ---------------------------------------------------------------------------- hermes / qwen on real templates


@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_qwen2_5template(as_string: bool) -> None:
    """Qwen2.5 renders `arguments | tojson`: OpenAI's string arguments come out double-encoded."""
    args = (lambda a: json.dumps(a, ensure_ascii=False)) if as_string else (lambda a: a)
    messages = [
        USER,
        assistant("Let me look.", tool_call("get_weather", args(WEATHER)), tool_call("search", args(SEARCH))),
    ]
    text = generated_text("qwen2_5.jinja", messages, "<|im_end|>", tools=TOOLS)
    assert text.startswith("Let me look.\n<tool_call>\n")
    if as_string:
        assert '"arguments": "{\\"city\\"' in text

    turn = get_parser("qwen").parse(text)
    assert turn.content == "Let me look."
    assert calls_of(turn) == [("get_weather", compact(WEATHER)), ("search", compact(SEARCH))]
    assert turn.reasoning is None


@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_qwen3_template_with_reasoning(as_string: bool) -> None:
    """Qwen3 thinks in <think>...</think> first; string arguments are inserted verbatim."""
    args = (lambda a: json.dumps(a, ensure_ascii=False)) if as_string else (lambda a: a)
    messages = [
        USER,
        assistant(
            "I'll check both.",
            tool_call("get_weather", args(WEATHER)),
            tool_call("search", args(SEARCH)),
            reasoning="The user wants the weather.\nThen a search.",
        ),
    ]
    text = generated_text("qwen3.jinja", messages, "<|im_end|>", tools=TOOLS)
    assert text.startswith("<think>\nThe user wants the weather.")

    turn = get_parser("hermes").parse(text)
    assert turn.reasoning == "The user wants the weather.\nThen a search."
    assert turn.content == "I'll check both."
    assert calls_of(turn) == [("get_weather", compact(WEATHER)), ("search", compact(SEARCH))]


def test_qwen3_template_calls_without_content() -> None:
    messages = [USER, assistant(None, tool_call("get_weather", WEATHER))]
    text = generated_text("qwen3.jinja", messages, "<|im_end|>", tools=TOOLS)
    turn = get_parser("qwen3").parse(text)
    assert turn.content is None and turn.reasoning is None
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


def test_qwen3_template_thinking_disabled() -> None:
    """With enable_thinking=False the prompt ends in an empty think block; the output has none."""
    messages = [USER, assistant(None, tool_call("get_weather", WEATHER))]
    prompt = render("qwen3.jinja", messages[:-1], tools=TOOLS, add_generation_prompt=True, enable_thinking=False)
    assert prompt.endswith("<think>\n\n</think>\n\n")
    text = generated_text("qwen3.jinja", messages, "<|im_end|>", tools=TOOLS)
    turn = get_parser("qwen3").parse(text)
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


# ---------------------------------------------------------------------------- qwen3_coder on real templates


def _write_messages() -> list[dict]:
    return [
        USER,
        assistant(
            "Writing the file, then the weather.",
            tool_call("write_file", WRITE),
            tool_call("get_weather", WEATHER),
            reasoning="Write first.",
        ),
    ]


def test_qwen3_6_template_typed_values_with_schema() -> None:
    """Qwen3.6 renders strings bare and everything else with tojson, so the schema-typed
    parse gives back exactly the arguments that were rendered."""
    text = generated_text("qwen3_6.jinja", _write_messages(), "<|im_end|>", tools=TOOLS)
    # The generation prompt ends with "<think>\n": the output starts inside the reasoning.
    assert text.startswith(
        "Write first.\n</think>\n\nWriting the file, then the weather.\n\n<tool_call>\n<function=write_file>\n"
    )

    turn = get_parser("qwen3_coder", tools=TOOLS).parse(text)
    assert turn.reasoning == "Write first."
    assert turn.content == "Writing the file, then the weather."
    assert calls_of(turn) == [("write_file", compact(WRITE)), ("get_weather", compact(WEATHER))]


def test_qwen3_6_template_typed_values_without_schema() -> None:
    """Without schemas a value is typed by its look: "3.10" (a string) reads as the number 3.1."""
    text = generated_text("qwen3_6.jinja", _write_messages(), "<|im_end|>", tools=TOOLS)
    turn = get_parser("qwen3_coder").parse(text)
    expected = dict(WRITE, version=3.1)
    assert calls_of(turn) == [("write_file", compact(expected)), ("get_weather", compact(WEATHER))]


def test_qwen3_5_template_python_style_booleans() -> None:
    """Qwen3.5 renders a boolean with `| string`, i.e. "True"; the schema turns it back into true."""
    text = generated_text("qwen3_5_think.jinja", _write_messages(), "<|im_end|>", tools=TOOLS)
    assert "<parameter=overwrite>\nTrue\n</parameter>" in text

    with_schema = get_parser("qwen3_coder", tools=[ToolSpec(**t["function"]) for t in TOOLS]).parse(text)
    assert calls_of(with_schema) == [("write_file", compact(WRITE)), ("get_weather", compact(WEATHER))]

    without_schema = get_parser("qwen3_coder").parse(text)
    assert json.loads(without_schema.tool_calls[0].function.arguments)["overwrite"] == "True"


def test_qwen3_coder_template_no_content() -> None:
    messages = [USER, assistant(None, tool_call("get_weather", WEATHER), reasoning="")]
    text = generated_text("qwen3_6.jinja", messages, "<|im_end|>", tools=TOOLS)
    turn = get_parser("qwen3_coder").parse(text)
    assert turn.content is None and turn.reasoning is None
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


# ---------------------------------------------------------------------------- llama3_json on real templates


@pytest.mark.parametrize("template", ["llama3_1.jinja", "llama3_2.jinja"])
@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_llama3template(template: str, as_string: bool) -> None:
    """Llama 3.1/3.2 render one bare {"name", "parameters"} object; `tojson` double-encodes strings."""
    arguments = json.dumps(SEARCH, ensure_ascii=False) if as_string else SEARCH
    messages = [{"role": "system", "content": "Be brief."}, USER, assistant(None, tool_call("search", arguments))]
    text = generated_text(template, messages, "<|eot_id|>", tools=TOOLS, bos_token="<|begin_of_text|>")
    assert text.startswith('{"name": "search", "parameters": ')

    turn = get_parser("llama3_json").parse(text)
    assert turn.content is None
    assert calls_of(turn) == [("search", compact(SEARCH))]


def test_llama3_1_template_builtin_tool() -> None:
    """Built-in tools render as <|python_tag|>name.call(k="v") and end with <|eom_id|>."""
    messages = [USER, assistant(None, tool_call("brave_search", {"query": "weather in Zürich"}))]
    text = generated_text(
        "llama3_1.jinja",
        messages,
        "<|eom_id|>",
        builtin_tools=["brave_search", "wolfram_alpha"],
        bos_token="<|begin_of_text|>",
    )
    assert text == '<|python_tag|>brave_search.call(query="weather in Zürich")<|eom_id|>'
    turn = get_parser("llama3_json").parse(text)
    assert calls_of(turn) == [("brave_search", compact({"query": "weather in Zürich"}))]


# ---------------------------------------------------------------------------- deepseek_v3 on the real template


def test_deepseek_v3_template_two_calls() -> None:
    messages = [
        USER,
        assistant(
            None,
            tool_call("get_weather", json.dumps(WEATHER, ensure_ascii=False)),
            tool_call("search", json.dumps(SEARCH, ensure_ascii=False)),
        ),
    ]
    text = generated_text(
        "deepseekv3.jinja",
        messages,
        "<｜end▁of▁sentence｜>",
        marker="<｜Assistant｜>",
        bos_token="<｜begin▁of▁sentence｜>",
    )
    assert text.startswith("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n")
    turn = get_parser("deepseek_v3").parse(text)
    assert turn.content is None
    assert calls_of(turn) == [("get_weather", compact(WEATHER)), ("search", compact(SEARCH))]


def test_deepseek_v3_template_content_before_call() -> None:
    messages = [USER, assistant("Checking.", tool_call("get_weather", json.dumps(WEATHER)))]
    text = generated_text(
        "deepseekv3.jinja",
        messages,
        "<｜end▁of▁sentence｜>",
        marker="<｜Assistant｜>",
        bos_token="<｜begin▁of▁sentence｜>",
    )
    turn = get_parser("deepseek_v3").parse(text)
    assert turn.content == "Checking."
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


# ---------------------------------------------------------------------------- mistral on real templates / tokenizers


@pytest.mark.parametrize("template", ["mistral_v3_tekken.jinja", "mistral_v2v3.jinja"])
@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_mistral_templates(template: str, as_string: bool) -> None:
    args = (lambda a: json.dumps(a, ensure_ascii=False)) if as_string else (lambda a: a)
    messages = [
        USER,
        assistant(
            None, tool_call("get_weather", args(WEATHER), "abc123XYZ"), tool_call("search", args(SEARCH), "def456UVW")
        ),
    ]
    text = generated_text(template, messages, "</s>", tools=TOOLS, bos_token="<s>", eos_token="</s>")
    assert re.match(r"\[TOOL_CALLS\] ?\[\{", text)
    turn = get_parser("mistral").parse(text)
    assert turn.content is None
    assert calls_of(turn) == [("get_weather", compact(WEATHER)), ("search", compact(SEARCH))]


MISTRAL_COMMON = json.loads((TEMPLATES / "mistral_common_rendered.json").read_text())


@pytest.mark.parametrize(
    ("version", "case"),
    [(version, case) for version, cases in MISTRAL_COMMON["rendered"].items() for case in cases],
)
def test_mistral_common_tokenizers(version: str, case: str) -> None:
    """Text as mistral-common's own instruct tokenizers encode it: the list form up to v7,
    [TOOL_CALLS]name[CALL_ID]id[ARGS]{...} in v11 and [TOOL_CALLS]name[ARGS]{...} in v13."""
    text = MISTRAL_COMMON["rendered"][version][case]
    spec = MISTRAL_COMMON["cases"][case]
    turn = get_parser("mistral").parse(text)
    assert turn.content == spec["content"]
    assert calls_of(turn) == [(call["name"], compact(call["arguments"])) for call in spec["calls"]]


def test_mistral_common_forms_are_the_ones_documented() -> None:
    rendered = MISTRAL_COMMON["rendered"]
    assert rendered["v7"]["two_calls"].startswith('[TOOL_CALLS][{"name": "get_weather"')
    assert rendered["v11"]["two_calls"].startswith("[TOOL_CALLS]get_weather[CALL_ID]abc123XYZ[ARGS]{")
    assert rendered["v13"]["two_calls"].startswith("[TOOL_CALLS]get_weather[ARGS]{")


# ---------------------------------------------------------------------------- every template: no calls


@pytest.mark.parametrize(
    ("template", "parser", "end", "extra"),
    [
        ("qwen2_5.jinja", "qwen", "<|im_end|>", {}),
        ("qwen3.jinja", "qwen3", "<|im_end|>", {}),
        ("qwen3_6.jinja", "qwen3_coder", "<|im_end|>", {}),
        ("llama3_1.jinja", "llama3_json", "<|eot_id|>", {"bos_token": "<|begin_of_text|>"}),
        ("llama3_2.jinja", "llama3_json", "<|eot_id|>", {"bos_token": "<|begin_of_text|>"}),
        ("mistral_v3_tekken.jinja", "mistral", "</s>", {"bos_token": "<s>", "eos_token": "</s>"}),
    ],
)
def test_templates_plain_answer(template: str, parser: str, end: str, extra: dict) -> None:
    answer = 'It is 21 °C in Zürich. JSON looks like {"a": 1}.'
    text = generated_text(template, [USER, assistant(answer)], end, tools=TOOLS, **extra)
    turn = get_parser(parser).parse(text)
    assert turn.content == answer
    assert turn.tool_calls == []


def test_deepseek_template_plain_answer() -> None:
    text = generated_text(
        "deepseekv3.jinja",
        [USER, assistant("Sunny.")],
        "<｜end▁of▁sentence｜>",
        marker="<｜Assistant｜>",
        bos_token="<s>",
    )
    turn = get_parser("deepseek_v3").parse(text)
    assert (turn.content, turn.tool_calls) == ("Sunny.", [])


def test_renderer_matches_transformers() -> None:
    """The jinja environment above renders exactly as transformers' apply_chat_template does."""
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    cases = [
        ("qwen2_5.jinja", [USER, assistant("x", tool_call("search", json.dumps(SEARCH)))], {}),
        ("qwen3.jinja", [USER, assistant("x", tool_call("search", SEARCH), reasoning="r")], {}),
        ("qwen3_5_think.jinja", _write_messages(), {}),
        ("qwen3_6.jinja", _write_messages(), {}),
        ("llama3_1.jinja", [USER, assistant(None, tool_call("search", SEARCH))], {"bos_token": "<|begin_of_text|>"}),
        ("deepseekv3.jinja", [USER, assistant(None, tool_call("search", json.dumps(SEARCH)))], {"bos_token": "<s>"}),
        (
            "mistral_v3_tekken.jinja",
            [USER, assistant(None, tool_call("search", SEARCH, "abc123XYZ"))],
            {"bos_token": "<s>", "eos_token": "</s>"},
        ),
    ]
    for template, messages, extra in cases:
        ours = render(template, messages, tools=TOOLS, **extra)
        rendered, _ = render_jinja_template(
            conversations=[copy.deepcopy(messages)],
            tools=TOOLS,
            chat_template=(TEMPLATES / template).read_text(),
            **extra,
        )
        assert rendered[0] == ours, template


# ---------------------------------------------------------------------------- hermes details


def test_hermes_unclosed_final_tag() -> None:
    text = 'Sure.\n<tool_call>\n{"name": "a", "arguments": {}}\n</tool_call>\n<tool_call>\n{"name": "b", "arguments": {"x": 1}}\n'
    turn = get_parser("hermes").parse(text)
    assert turn.content == "Sure."
    assert calls_of(turn) == [("a", "{}"), ("b", '{"x":1}')]


def test_hermes_block_cut_by_next_open_tag() -> None:
    text = '<tool_call>{"name": "a", "arguments": {}}<tool_call>{"name": "b", "arguments": {}}</tool_call>'
    assert calls_of(get_parser("hermes").parse(text)) == [("a", "{}"), ("b", "{}")]


def test_hermes_several_objects_and_lists_in_one_block() -> None:
    text = (
        '<tool_call>\n[{"name": "a", "arguments": {"i": 1}}, {"name": "b", "arguments": {"i": 2}}]\n</tool_call>'
        '<tool_call>\n{"name": "c", "arguments": {}}\n{"name": "d", "arguments": {}}\n</tool_call>'
    )
    turn = get_parser("hermes").parse(text)
    assert [name for name, _ in calls_of(turn)] == ["a", "b", "c", "d"]


def test_hermes_double_encoded_arguments_decoded_once() -> None:
    inner = json.dumps({"q": json.dumps({"nested": True})})  # an argument that is itself JSON text stays a string
    text = "<tool_call>" + json.dumps({"name": "f", "arguments": inner}) + "</tool_call>"
    args = get_parser("hermes").parse(text).tool_calls[0].function.arguments
    assert args == compact({"q": '{"nested": true}'})


@pytest.mark.parametrize(
    ("body", "name", "arguments"),
    [
        ('{"name": "f", "arguments": {"a": 1}', "f", '{"a":1}'),  # outer brace missing: arguments still valid
        ('{"name": "f", "arguments": {"a": 1,}}', "f", '{"a": 1,}'),  # trailing comma: kept raw
        ('{"name": "f", "arguments": {\'a\': 1}}', "f", "{'a': 1}"),  # Python dict: kept raw
        ('{"name": "f", "arguments": "not json"}', "f", "not json"),  # a plain string: kept as is
        ('{"name": "f", "arguments": [1, 2]}', "f", "[1,2]"),  # valid JSON, not an object: kept
        ('{"name": "f"}', "f", "{}"),  # no arguments at all
        ('{"name": "f", "arguments": ""}', "f", "{}"),
        ("no json here", "", "no json here"),  # nothing recoverable: name "", text kept
        ('{"city": "Paris"}', "", '{"city":"Paris"}'),  # arguments without the call wrapper
        ('```json\n{"name": "f", "arguments": {"a": 1}}\n```', "f", '{"a":1}'),  # fenced
        ('{"type": "function", "function": {"name": "f", "arguments": "{\\"a\\": 1}"}}', "f", '{"a":1}'),
    ],
)
def test_hermes_broken_bodies_are_kept(body: str, name: str, arguments: str) -> None:
    turn = get_parser("hermes").parse(f"<tool_call>\n{body}\n</tool_call>")
    assert calls_of(turn) == [(name, arguments)]


def test_hermes_prose_after_a_call_in_its_block_is_not_a_call() -> None:
    text = '<tool_call>\n{"name": "a", "arguments": {}}\nHope this helps!\n</tool_call>'
    assert calls_of(get_parser("hermes").parse(text)) == [("a", "{}")]


def test_hermes_empty_block_is_no_call() -> None:
    turn = get_parser("hermes").parse("Hi <tool_call>\n</tool_call>")
    assert (turn.content, turn.tool_calls) == ("Hi", [])


def test_hermes_no_calls_keeps_text() -> None:
    turn = get_parser("hermes").parse("  Just an answer.\nTwo lines.<|im_end|>")
    assert turn == ParsedTurn(content="Just an answer.\nTwo lines.", tool_calls=[], reasoning=None)


def test_hermes_text_after_the_calls_is_not_content() -> None:
    text = 'Before.<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_response>hallucinated</tool_response>'
    turn = get_parser("hermes").parse(text)
    assert turn.content == "Before."
    assert calls_of(turn) == [("a", "{}")]


@pytest.mark.parametrize(
    ("text", "reasoning", "content", "n_calls"),
    [
        ("<think>\nplan\n</think>\n\nAnswer.", "plan", "Answer.", 0),
        ("plan\n</think>\n\nAnswer.", "plan", "Answer.", 0),  # the prompt opened the think block
        ("<think>\nstill thinking when cut off", "still thinking when cut off", None, 0),
        ("<think>\n\n</think>\n\nAnswer.", None, "Answer.", 0),
        ('<tool_call>{"name": "a", "arguments": {"s": "</think>"}}</tool_call>', None, None, 1),
        ('<think>x</think><tool_call>{"name": "a", "arguments": {}}</tool_call>', "x", None, 1),
    ],
)
def test_hermes_reasoning(text: str, reasoning: str | None, content: str | None, n_calls: int) -> None:
    turn = get_parser("hermes").parse(text)
    assert (turn.reasoning, turn.content, len(turn.tool_calls)) == (reasoning, content, n_calls)
    if n_calls and "</think>" in text and not text.startswith("<think>"):
        assert json.loads(turn.tool_calls[0].function.arguments) == {"s": "</think>"}


# ---------------------------------------------------------------------------- qwen3_coder details


def test_qwen3_coder_unclosed_tags() -> None:
    text = (
        "Doing it.\n<tool_call>\n<function=write_file>\n<parameter=path>\na.txt\n</parameter>\n"
        "<parameter=content>\nline 1\nline 2\n"  # cut off: no </parameter>, </function>, </tool_call>
    )
    turn = get_parser("qwen3_coder").parse(text)
    assert turn.content == "Doing it."
    assert calls_of(turn) == [("write_file", compact({"path": "a.txt", "content": "line 1\nline 2"}))]


def test_qwen3_coder_parameter_cut_by_next_parameter() -> None:
    text = "<tool_call>\n<function=f>\n<parameter=a>\n1\n<parameter=b>\nx\n</parameter>\n</function>\n</tool_call>"
    assert calls_of(get_parser("qwen3_coder").parse(text)) == [("f", compact({"a": 1, "b": "x"}))]


def test_qwen3_coder_multiple_calls_and_no_wrapper() -> None:
    text = (
        "<tool_call>\n<function=a>\n</function>\n</tool_call>\n"
        "<function=b>\n<parameter=x>\n2\n</parameter>\n</function>\n"
        "<tool_call>\n<function=c>\n<parameter=y>\nz\n</parameter>\n</function>\n<function=d>\n</function>\n</tool_call>"
    )
    assert calls_of(get_parser("qwen3_coder").parse(text)) == [
        ("a", "{}"),
        ("b", '{"x":2}'),
        ("c", '{"y":"z"}'),
        ("d", "{}"),
    ]


def test_qwen3_coder_keeps_inner_whitespace() -> None:
    text = "<tool_call>\n<function=f>\n<parameter=code>\n\n    indented\n\n</parameter>\n</function>\n</tool_call>"
    args = json.loads(get_parser("qwen3_coder").parse(text).tool_calls[0].function.arguments)
    assert args == {"code": "\n    indented\n"}


def test_qwen3_coder_json_inside_tool_call() -> None:
    text = '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>'
    assert calls_of(get_parser("qwen3_coder").parse(text)) == [("f", '{"a":1}')]


@pytest.mark.parametrize(
    ("raw", "schema", "expected"),
    [
        ("42", None, 42),
        ("-1.5e3", None, -1500.0),
        ("true", None, True),
        ("null", None, None),
        ('{"a": [1]}', None, {"a": [1]}),
        ("[1, 2]", None, [1, 2]),
        ('"quoted"', None, '"quoted"'),  # a JSON string stays the raw text
        ("007", None, "007"),
        ("NaN", None, "NaN"),
        ("plain text", None, "plain text"),
        ("42", {"type": "string"}, "42"),
        ("true", {"type": "string"}, "true"),
        ("3", {"type": "integer"}, 3),
        ("3.0", {"type": "integer"}, 3),
        ("three", {"type": "integer"}, "three"),  # wrong type: kept raw for the tool to reject
        ("2.5", {"type": "number"}, 2.5),
        ("True", {"type": "boolean"}, True),
        ("FALSE", {"type": "boolean"}, False),
        ("yes", {"type": "boolean"}, "yes"),
        ("{'a': 1}", {"type": "object"}, {"a": 1}),  # Python literal accepted for objects
        ("[1,", {"type": "array"}, "[1,"),
        ("5", {"anyOf": [{"type": "integer"}, {"type": "string"}]}, 5),
        ("five", {"type": ["integer", "string"]}, "five"),
        ("None", {"type": ["string", "null"]}, None),
        ("2", {"enum": [1, 2, 3]}, 2),
        ("anything", {"description": "no type"}, "anything"),
    ],
)
def test_qwen3_coder_value_typing(raw: str, schema: dict | None, expected: Any) -> None:
    tools = None
    if schema is not None:
        tools = [
            {
                "type": "function",
                "function": {"name": "f", "parameters": {"type": "object", "properties": {"v": schema}}},
            }
        ]
    text = f"<tool_call>\n<function=f>\n<parameter=v>\n{raw}\n</parameter>\n</function>\n</tool_call>"
    args = get_parser("qwen3_coder", tools=tools).parse(text).tool_calls[0].function.arguments
    assert args == compact({"v": expected})


def test_qwen3_coder_no_calls() -> None:
    turn = get_parser("qwen3_coder").parse("<think>\nhm\n</think>\n\nNo tools needed.")
    assert (turn.reasoning, turn.content, turn.tool_calls) == ("hm", "No tools needed.", [])


# ---------------------------------------------------------------------------- llama3_json details


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('{"name": "f", "parameters": {"a": 1}}', None, [("f", '{"a":1}')]),
        ('<|python_tag|>{"name": "f", "parameters": {"a": 1}}<|eom_id|>', None, [("f", '{"a":1}')]),
        ('{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a":1}')]),
        (
            '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"b": [true]}}',
            None,
            [("f", "{}"), ("g", '{"b":[true]}')],
        ),
        ('{"name": "f", "parameters": "{\\"a\\": 1}"}', None, [("f", '{"a":1}')]),
        ('Let me search.<|python_tag|>{"name": "f", "parameters": {}}', "Let me search.", [("f", "{}")]),
        ('{"name": "f", "parameters": {}}\nThat should do it.', "That should do it.", [("f", "{}")]),
        ('{"name": "f", "parameters": {"a": 1,}}', None, [("f", '{"a": 1,}')]),  # broken: kept raw
        (
            '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {"b": ',
            None,
            [("f", '{"a":1}'), ("g", '{"b":')],
        ),
        (
            '<|python_tag|>wolfram_alpha.call(query="2+2", precise=True)',
            None,
            [("wolfram_alpha", '{"query":"2+2","precise":true}')],
        ),
        ("<|python_tag|>brave_search.call(query=some_variable)", None, [("brave_search", "query=some_variable")]),
        ("The answer is 4.", "The answer is 4.", []),
        ('{"result": 4, "unit": "apples"}', '{"result": 4, "unit": "apples"}', []),  # JSON, but not a call
        ('{"name": "Alice", "age": 3}', '{"name": "Alice", "age": 3}', []),  # has a name, no parameters
    ],
)
def test_llama3_json(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser("llama3_json").parse(text)
    assert (turn.content, calls_of(turn)) == (content, calls)


def test_llama3_does_not_treat_think_tags_as_reasoning() -> None:
    turn = get_parser("llama3_json").parse("<think>not a reasoning model</think> hi")
    assert turn.reasoning is None and turn.content == "<think>not a reasoning model</think> hi"


# ---------------------------------------------------------------------------- mistral details


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ('[TOOL_CALLS] [{"name": "f", "arguments": {"a": 1}}]</s>', None, [("f", '{"a":1}')]),
        ('[TOOL_CALLS]{"name": "f", "arguments": {"a": 1}}', None, [("f", '{"a":1}')]),
        ('[TOOL_CALLS][{"name": "f", "arguments": "{\\"a\\": 1}"}]', None, [("f", '{"a":1}')]),
        (
            '[TOOL_CALLS][{"name": "f", "arguments": {"a": 1}}, {"name": "g", "arguments": {"b": ',
            None,
            [("f", '{"a":1}'), ("g", '{"b":')],
        ),
        ('Sure.[TOOL_CALLS]f[ARGS]{"a": 1}[TOOL_CALLS]g[ARGS]{}', "Sure.", [("f", '{"a":1}'), ("g", "{}")]),
        ('[TOOL_CALLS]f[CALL_ID]123456789[ARGS]{"a": 1}', None, [("f", '{"a":1}')]),
        ('[TOOL_CALLS]f[ARGS]{"a": 1,}', None, [("f", '{"a": 1,}')]),  # broken: kept raw
        ('[TOOL_CALLS]f[ARGS]{"a": "unterminated', None, [("f", '{"a": "unterminated')]),  # cut off
        ('[TOOL_CALLS]f[ARGS]"{\\"a\\": 1}"', None, [("f", '{"a":1}')]),  # double-encoded
        ('[TOOL_CALLS]f{"a": 1}', None, [("f", '{"a":1}')]),  # [ARGS] missing
        ("[TOOL_CALLS]get_time", None, [("get_time", "{}")]),
        ("[THINK]Let me think.[/THINK]It is 4.", "It is 4.", []),
        ("No tools.", "No tools.", []),
    ],
)
def test_mistral(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser("mistral").parse(text)
    assert (turn.content, calls_of(turn)) == (content, calls)


def test_mistral_reasoning_then_calls() -> None:
    turn = get_parser("mistral").parse(
        '[THINK]Weather needed.[/THINK][TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>'
    )
    assert turn.reasoning == "Weather needed."
    assert turn.content is None
    assert calls_of(turn) == [("get_weather", '{"city":"Paris"}')]


# ---------------------------------------------------------------------------- deepseek details

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, CE, SEP = "<｜tool▁call▁begin｜>", "<｜tool▁call▁end｜>", "<｜tool▁sep｜>"


def v3_call(name: str, args: str) -> str:
    return f"{CB}function{SEP}{name}\n```json\n{args}\n```{CE}"


A1 = '{"a": 1}'
DEEPSEEK_CASES = [
    (
        B + v3_call("f", "{}") + "\n" + v3_call("g", A1) + E + "<｜end▁of▁sentence｜>",
        None,
        [("f", "{}"), ("g", '{"a":1}')],
    ),
    ("Hi." + B + v3_call("f", A1), "Hi.", [("f", '{"a":1}')]),  # no end tokens
    (B + CB + "function" + SEP + "f\n```json\n" + A1, None, [("f", '{"a":1}')]),  # cut off in the fence
    (B + CB + "function" + SEP + "f\n" + A1 + CE + E, None, [("f", '{"a":1}')]),  # no fence
    (B + v3_call("f", '{"a": 1,}') + E, None, [("f", '{"a": 1,}')]),  # broken: kept raw
    (B + v3_call("f", json.dumps(A1)) + E, None, [("f", '{"a":1}')]),  # double-encoded
    (CB + "function" + SEP + "f\n```json\n{}\n```" + CE, None, [("f", "{}")]),  # no calls-begin token
    ("Plain answer.<｜end▁of▁sentence｜>", "Plain answer.", []),
]


@pytest.mark.parametrize(("text", "content", "calls"), DEEPSEEK_CASES)
def test_deepseek_v3(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser("deepseek_v3").parse(text)
    assert (turn.content, calls_of(turn)) == (content, calls)


def test_deepseek_v31_documented_format() -> None:
    """DeepSeek-V3.1's format as its model card documents it (no template found offline):
    <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>name<｜tool▁sep｜>{args}<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>"""
    text = (
        f"</think>Let me check.{B}{CB}get_weather{SEP}{json.dumps(WEATHER, ensure_ascii=False)}{CE}"
        f"{CB}search{SEP}{json.dumps(SEARCH)}{CE}{E}<｜end▁of▁sentence｜>"
    )
    turn = get_parser("deepseek_v31").parse(text)
    assert turn.content == "Let me check."
    assert turn.reasoning is None  # "</think>" straight away: thinking was empty
    assert calls_of(turn) == [("get_weather", compact(WEATHER)), ("search", compact(SEARCH))]


def test_deepseek_reasoning() -> None:
    text = f"The user wants weather.\n</think>\n\n{B}{v3_call('get_weather', json.dumps(WEATHER))}{E}"
    turn = get_parser("deepseek_v3").parse(text)
    assert turn.reasoning == "The user wants weather."
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


# ---------------------------------------------------------------------------- every parser


FAMILY_TWO_CALLS = {
    "hermes": '<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=a>\n<parameter=x>\n1\n</parameter>\n</function>\n</tool_call>\n" * 2,
    "llama3_json": '{"name": "a", "parameters": {"x": 1}}; {"name": "a", "parameters": {"x": 1}}',
    "mistral": '[TOOL_CALLS]a[ARGS]{"x": 1}[TOOL_CALLS]a[ARGS]{"x": 1}',
    "deepseek_v3": B + v3_call("a", '{"x": 1}') + "\n" + v3_call("a", '{"x": 1}') + E,
}


@pytest.mark.parametrize("family", sorted(FAMILY_TWO_CALLS))
def test_ids_are_deterministic_and_distinct(family: str) -> None:
    text = FAMILY_TWO_CALLS[family]
    first = get_parser(family).parse(text)
    again = get_parser(family).parse(text)
    assert calls_of(first) == [("a", '{"x":1}'), ("a", '{"x":1}')]
    ids = [call.id for call in first.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{8}", i) for i in ids)
    assert len(set(ids)) == 2
    assert ids == [call.id for call in again.tool_calls]
    assert ids == [make_call_id(text, 0), make_call_id(text, 1)]
    seeded = [call.id for call in get_parser(family).parse(text, id_seed="rollout-7/turn-3").tool_calls]
    assert set(seeded).isdisjoint(ids)


@pytest.mark.parametrize("family", sorted(FAMILY_TWO_CALLS))
def test_plain_text_is_content(family: str) -> None:
    turn = get_parser(family).parse("Hello there.")
    assert turn == ParsedTurn(content="Hello there.")
    assert get_parser(family).parse("").content is None


def test_to_message() -> None:
    turn = get_parser("hermes").parse('<think>r</think>c<tool_call>{"name": "a", "arguments": {}}</tool_call>')
    message = turn.to_message()
    assert message.role == "assistant"
    assert (message.content, message.reasoning_content) == ("c", "r")
    assert message.tool_calls == turn.tool_calls
    assert get_parser("hermes").parse("hi").to_message().tool_calls is None


# ---------------------------------------------------------------------------- registry


def test_required_families_are_registered() -> None:
    assert {"hermes", "qwen", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "deepseek_v31"} <= set(
        parser_names()
    )
    assert type(get_parser("qwen")) is type(get_parser("hermes"))
    assert type(get_parser("Qwen3-Coder")) is type(get_parser("qwen3_coder"))
    assert get_parser("hermes") is not get_parser("hermes")


def test_unknown_parser_is_a_config_error_listing_known_names() -> None:
    with pytest.raises(ConfigError) as info:
        get_parser("gpt5_harmony")
    assert "gpt5_harmony" in info.value.message
    for name in ("hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3"):
        assert name in info.value.message
    assert info.value.retryable is False


def test_register_a_new_family() -> None:
    @register_parser("test_upper", "test_upper_alias")
    class UpperParser(ToolCallParser):
        def extract(self, text: str) -> tuple[str | None, list[RawCall]]:
            if text.startswith("CALL "):
                return None, [RawCall(text[5:].strip(), "{}")]
            return text, []

    try:
        assert get_parser("test_upper_alias").parse("CALL ping</s>").tool_calls[0].function.name == "ping"
        assert UpperParser.name == "test_upper"
        with pytest.raises(ConfigError):

            @register_parser("test_upper")
            class Other(UpperParser):
                pass

    finally:
        _REGISTRY.pop("test_upper", None)
        _REGISTRY.pop("test_upper_alias", None)
