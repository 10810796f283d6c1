"""The kimi_k2, glm45, glm47, longcat and llama4_json parsers, each tested on text rendered
by its family's chat template, plus the awkward cases a sampled model produces.

Templates (tests/data/templates/, provenance in SOURCES.md):

    kimi_k2       Kimi-K2-Instruct, Kimi-K2-Thinking and the early Kimi-K2 template
                  (llama-cpp-python 0.3.36 sdist, llama.cpp's models/templates/)
    glm45         GLM-4.5 (trl 1.16.0, glm4moe.jinja) and GLM-4.6 (llama-cpp-python 0.3.36)
    glm47         GLM-4.7-Flash (llama-cpp-python 0.3.36)
    llama4_json   Llama 4 (axolotl 0.19.0)
    longcat       NO real template on this machine: longcat_flash_documented.jinja is written
                  from the documented format and says so

The generated text is taken the way a token-level client sees it: the render of the
conversation minus the render of the prompt with the generation prompt, up to and
including the token generation stopped on.

The rendering helpers are this file's own (tests/test_parsers.py has its twins) so that
the two files do not depend on each other.
"""

from __future__ import annotations

import copy
import json
import random
import re
from typing import Any

import pytest

from temporal_rollouts.llm.parsers import ParsedTurn, get_parser, make_call_id, parser_names
from tests.support import TEMPLATES
from tests.support.chat_templates import TOOLS, calls_of, compact, render

# ---------------------------------------------------------------------------- rendering


def generated_text(
    template: str,
    before: list[dict],
    reply: dict,
    end: str | None,
    *,
    after: list[dict] = (),
    tools: list[dict] | None = None,
    **extra: Any,
) -> str:
    """`reply` as the model generated it after `before`, up to and including `end`
    (None: the rest of the render).

    `after` (a tool result, a user turn) follows the reply in the render, for templates
    that write the token generation stops on only at the start of the next turn (GLM)."""
    full = render(template, [*before, reply, *after], tools=tools, **extra)
    prompt = render(template, before, tools=tools, add_generation_prompt=True, **extra)
    assert full.startswith(prompt), "template is not prefix-preserving here"
    text = full[len(prompt) :]
    return text if end is None else text[: text.index(end) + len(end)]


WEATHER = {"city": "Zürich", "unit": "celsius"}
SEARCH = {
    "query": 'a "quoted" <b>tag</b> & [bracket] \\ backslash',
    "filters": {"lang": "fr", "max": 3, "nested": {"deep": [1, {"x": None}]}},
}
WRITE = {
    "path": "src/app.py",
    "content": 'def f():\n    return {"a": 1}\n\n# </tool_call> is just text here\n',
    "overwrite": True,
    "retries": 3,
    "version": "3.10",
    "tags": ["a", "b"],
    "meta": {"k": [1, 2.5, None]},
}


USER = {"role": "user", "content": "What's the weather in Zürich? Then search, then write a file."}
SYSTEM = {"role": "system", "content": "Be brief."}
ANSWER = 'It is 21 °C in Zürich. JSON looks like {"a": 1}.'
EXPECTED_THREE = [("get_weather", compact(WEATHER)), ("search", compact(SEARCH)), ("write_file", compact(WRITE))]


def tool_call(name: str, arguments: Any, call_id: str = "call_1") -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def assistant(content: str | None, *calls: dict, reasoning: str | None = None) -> dict:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    return message


def three_calls(as_string: bool = False) -> list[dict]:
    args = (lambda a: json.dumps(a, ensure_ascii=False)) if as_string else (lambda a: a)
    return [
        tool_call("get_weather", args(WEATHER), "c1"),
        tool_call("search", args(SEARCH), "c2"),
        tool_call("write_file", args(WRITE), "c3"),
    ]


def tool_result(content: str = '{"temp": 21}') -> dict:
    return {"role": "tool", "tool_call_id": "c1", "name": "get_weather", "content": content}


def assert_prefixes_parse(
    family: str, text: str, expected: list[tuple[str, str]], close: str, **parser_kwargs: Any
) -> None:
    """Every prefix of `text` (generation cut off anywhere) parses without raising, and
    every call whose close marker (the regex `close`) made it into the prefix comes back exactly."""
    parser = get_parser(family, **parser_kwargs)
    ends = [match.end() for match in re.finditer(close, text)]
    assert len(ends) == len(expected)
    for cut in range(len(text) + 1):
        prefix = text[:cut]
        turn = parser.parse(prefix)
        closed = sum(1 for end in ends if end <= cut)
        assert calls_of(turn)[:closed] == expected[:closed], (cut, prefix)


# ---------------------------------------------------------------------------- kimi_k2 on real templates


KIMI_TEMPLATES = ["kimi_k2_instruct.jinja", "kimi_k2_thinking.jinja", "moonshotai_kimi_k2.jinja"]


@pytest.mark.parametrize("template", KIMI_TEMPLATES)
@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_kimi_k2_templates_three_calls(template: str, as_string: bool) -> None:
    """Dict arguments are tojson'd; string arguments are written as they are by the K2-Instruct
    and -Thinking templates and tojson'd again (double-encoded) by the early one."""
    reply = assistant("Let me look.", *three_calls(as_string))
    text = generated_text(template, [SYSTEM, USER], reply, "<|im_end|>", tools=TOOLS)
    assert "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>" in text
    assert "functions.write_file:2" in text

    turn = get_parser("kimi_k2").parse(text)
    assert turn.content == "Let me look."
    assert calls_of(turn) == EXPECTED_THREE
    if template == "kimi_k2_thinking.jinja":
        assert text.startswith("<think></think>")
    assert turn.reasoning is None


def test_kimi_k2_thinking_template_reasoning() -> None:
    reply = assistant(None, tool_call("get_weather", WEATHER), reasoning="The user wants the weather.\nCall the tool.")
    text = generated_text("kimi_k2_thinking.jinja", [USER], reply, "<|im_end|>", tools=TOOLS)
    assert text.startswith("<think>The user wants the weather.")
    turn = get_parser("kimi").parse(text)
    assert turn.reasoning == "The user wants the weather.\nCall the tool."
    assert turn.content is None
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


def test_kimi_k2_ids_count_across_turns() -> None:
    """The K2-Instruct template numbers calls across the whole conversation (functions.name:3);
    the index is not part of the name."""
    before = [
        USER,
        assistant(None, *three_calls()),
        tool_result(),
        tool_result(),
        tool_result(),
        {"role": "user", "content": "Again."},
    ]
    text = generated_text(
        "kimi_k2_instruct.jinja", before, assistant(None, tool_call("get_weather", WEATHER)), "<|im_end|>", tools=TOOLS
    )
    assert "functions.get_weather:3<|tool_call_argument_begin|>" in text
    assert calls_of(get_parser("kimi_k2").parse(text)) == [("get_weather", compact(WEATHER))]


@pytest.mark.parametrize("template", KIMI_TEMPLATES)
def test_kimi_k2_templates_plain_answer(template: str) -> None:
    text = generated_text(template, [USER], assistant(ANSWER), "<|im_end|>", tools=TOOLS)
    turn = get_parser("kimi_k2").parse(text)
    assert (turn.content, turn.tool_calls) == (ANSWER, [])


def test_kimi_k2_template_truncated_anywhere() -> None:
    text = generated_text(
        "kimi_k2_instruct.jinja", [USER], assistant("Let me look.", *three_calls()), "<|im_end|>", tools=TOOLS
    )
    assert_prefixes_parse("kimi_k2", text, EXPECTED_THREE, re.escape(CE))


KB, KE = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
CB, AB, CE = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (f'{KB}{CB}functions.f:0{AB}{{"a": 1}}{CE}{KE}', None, [("f", '{"a":1}')]),
        (f'{KB}{CB}f:0{AB}{{"a": 1}}{CE}{KE}', None, [("f", '{"a":1}')]),  # no functions. prefix
        (f"{KB}{CB}functions.ns.tool:12{AB}{{}}{CE}{KE}", None, [("ns.tool", "{}")]),  # dotted name kept
        (f'{KB}\n{CB} functions.f:0 {AB} {{"a": 1}} {CE}\n{KE}', None, [("f", '{"a":1}')]),  # whitespace around tokens
        (
            f"Hi.<|tool_call_section_begin|>{CB}functions.f:0{AB}{{}}{CE}<|tool_call_section_end|>",
            "Hi.",
            [("f", "{}")],
        ),  # singular
        (f"{CB}functions.f:0{AB}{{}}{CE}", None, [("f", "{}")]),  # no section token
        (f'{KB}functions.f:0{AB}{{"a": 1}}', None, [("f", '{"a":1}')]),  # no call-begin token
        (f'{KB}{CB}functions.f:0{{"a": 1}}{CE}', None, [("f", '{"a":1}')]),  # no argument token
        (f"{KB}{CB}functions.get_time:0{CE}{KE}", None, [("get_time", "{}")]),  # no arguments at all
        (f'{KB}{CB}functions.f:0{AB}{{"a": 1,}}{CE}{KE}', None, [("f", '{"a": 1,}')]),  # broken: kept raw
        (f"{KB}{CB}functions.f:0{AB}{{'a': 1}}{CE}{KE}", None, [("f", "{'a': 1}")]),  # Python dict: kept raw
        (f'{KB}{CB}functions.f:0{AB}{{"a": "unterminated', None, [("f", '{"a": "unterminated')]),  # cut off
        (
            f"{KB}{CB}functions.f:0{AB}{json.dumps(json.dumps({'a': 1}))}{CE}{KE}",
            None,
            [("f", '{"a":1}')],
        ),  # double-encoded
        (f'{KB}{CB}:0{AB}{{"a": 1}}{CE}{KE}', None, [("", ':0<|tool_call_argument_begin|>{"a": 1}')]),  # no name
        (f"{KB}{CB}{CE}{CB}functions.f:1{AB}{{}}{CE}{KE}", None, [("f", "{}")]),  # an empty call is no call
        (
            f"A.{KB}{CB}functions.f:0{AB}{{}}{CE}{KE}Then I will answer.",
            "A.",
            [("f", "{}")],
        ),  # text after the section dropped
        (f"Thinking about {KB}", "Thinking about", []),  # a section with nothing in it
        ("No tools.<|im_end|>", "No tools.", []),
    ],
)
def test_kimi_k2(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser("kimi_k2").parse(text)
    assert (turn.content, calls_of(turn)) == (content, calls)


# ---------------------------------------------------------------------------- glm45 / glm47 on real templates


GLM_TEMPLATES = [("glm4moe.jinja", "glm45"), ("glm4_6.jinja", "glm4_moe"), ("glm4_7_flash.jinja", "glm47")]


@pytest.mark.parametrize(("template", "family"), GLM_TEMPLATES)
def test_glm_templates_three_calls_with_schema(template: str, family: str) -> None:
    """Strings are written bare and everything else with tojson, so the schema-typed parse
    gives back exactly the arguments that were rendered (quotes, newlines, nested JSON)."""
    reply = assistant("Let me look.", *three_calls(), reasoning="Weather first.\nThen the rest.")
    text = generated_text(template, [SYSTEM, USER], reply, "<|observation|>", after=[tool_result()], tools=TOOLS)
    if family == "glm47":  # the generation prompt ends in <think>: the output starts inside the reasoning
        assert text.startswith(
            "Weather first.\nThen the rest.</think>Let me look.<tool_call>get_weather<arg_key>city</arg_key>"
        )
    else:
        assert text.startswith(
            "\n<think>Weather first.\nThen the rest.</think>\nLet me look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n"
        )

    turn = get_parser(family, tools=TOOLS).parse(text)
    assert turn.reasoning == "Weather first.\nThen the rest."
    assert turn.content == "Let me look."
    assert calls_of(turn) == EXPECTED_THREE


@pytest.mark.parametrize(("template", "family"), GLM_TEMPLATES)
def test_glm_templates_without_schema(template: str, family: str) -> None:
    """Without schemas a value is typed by its look: the string "3.10" reads as the number 3.1.
    (Content is "": GLM's templates write a None content as the text "None".)"""
    reply = assistant("", *three_calls(), reasoning="r")
    text = generated_text(template, [USER], reply, "<|observation|>", after=[tool_result()], tools=TOOLS)
    turn = get_parser(family).parse(text)
    assert turn.content is None
    assert calls_of(turn) == [EXPECTED_THREE[0], EXPECTED_THREE[1], ("write_file", compact(dict(WRITE, version=3.1)))]


@pytest.mark.parametrize(("template", "family"), GLM_TEMPLATES)
def test_glm_templates_plain_answer(template: str, family: str) -> None:
    reply = assistant(ANSWER, reasoning="Easy.")
    text = generated_text(template, [USER], reply, None, tools=TOOLS) + "<|user|>"  # the token generation stops on
    turn = get_parser(family).parse(text)
    assert (turn.reasoning, turn.content, turn.tool_calls) == ("Easy.", ANSWER, [])


def test_glm47_template_thinking_disabled() -> None:
    """With enable_thinking=False the prompt ends in </think>; the output has no reasoning."""
    reply = assistant("Checking.", tool_call("get_weather", WEATHER), reasoning="")
    text = generated_text(
        "glm4_7_flash.jinja",
        [USER],
        reply,
        "<|observation|>",
        after=[tool_result()],
        tools=TOOLS,
        enable_thinking=False,
    )
    assert text.startswith("Checking.<tool_call>get_weather")
    turn = get_parser("glm47", tools=TOOLS).parse(text)
    assert (turn.reasoning, turn.content) == (None, "Checking.")
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


@pytest.mark.parametrize(("template", "family"), GLM_TEMPLATES)
def test_glm_templates_truncated_anywhere(template: str, family: str) -> None:
    reply = assistant("Let me look.", *three_calls(), reasoning="r")
    text = generated_text(template, [USER], reply, "<|observation|>", after=[tool_result()], tools=TOOLS)
    # WRITE's content holds "</tool_call> is just text": only a close followed by a tag ends a call
    assert_prefixes_parse(family, text, EXPECTED_THREE, r"</tool_call>(?=\s*<)", tools=TOOLS)


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        ("<tool_call>get_time\n</tool_call>", None, [("get_time", "{}")]),  # no arguments
        ("<tool_call>get_time</tool_call>", None, [("get_time", "{}")]),
        ("<tool_call>f<arg_key>a</arg_key><arg_value>1</arg_value>", None, [("f", '{"a":1}')]),  # no </tool_call>
        # a value runs to its own close tag, whatever it holds
        (
            "<tool_call>f<arg_key>a</arg_key><arg_value>x<arg_key>b</arg_key><arg_value>y</arg_value></tool_call>",
            None,
            [("f", '{"a":"x<arg_key>b</arg_key><arg_value>y"}')],
        ),
        (
            "<tool_call>f<arg_key>a</arg_key><arg_value>x</tool_call><tool_call>y</arg_value></tool_call>",
            None,
            [("f", '{"a":"x</tool_call><tool_call>y"}')],
        ),
        (
            "<tool_call>f<arg_key>a</arg_key><arg_value>x<arg_key>b</arg_key><arg_value>y",
            None,
            [("f", '{"a":"x","b":"y"}')],
        ),  # never closed: cut at the next key
        ("<tool_call>f<arg_key>a<arg_value>1</arg_value></tool_call>", None, [("f", '{"a":1}')]),  # no </arg_key>
        (
            "<tool_call>f\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>\n<arg_key>b</arg_key>",
            None,
            [("f", '{"a":1}')],
        ),  # key, no value
        (
            "<tool_call>f<arg_key>a</arg_key><arg_value>  two spaces  </arg_value></tool_call>",
            None,
            [("f", '{"a":"  two spaces  "}')],
        ),
        (
            "<tool_call>f<arg_key>a</arg_key><arg_value>{'x': 1}</arg_value></tool_call>",
            None,
            [("f", '{"a":"{\'x\': 1}"}')],
        ),  # typed by look: not JSON, a string
        (
            "<tool_call>a</tool_call><tool_call>b<arg_key>k</arg_key><arg_value>v</arg_value></tool_call>",
            None,
            [("a", "{}"), ("b", '{"k":"v"}')],
        ),
        ("<tool_call>a<tool_call>b</tool_call>", None, [("a", "{}"), ("b", "{}")]),  # cut by the next open tag
        (
            '<tool_call>\n{"name": "f", "arguments": {"a": 1}}\n</tool_call>',
            None,
            [("f", '{"a":1}')],
        ),  # Hermes JSON inside
        (
            "<tool_call><arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
            None,
            [("", "<arg_key>a</arg_key><arg_value>1</arg_value>")],
        ),  # no name
        (
            "<tool_call>f\nI will now call it.\n<arg_key>a</arg_key><arg_value>1</arg_value></tool_call>",
            None,
            [("f", '{"a":1}')],
        ),
        ("Hi <tool_call>\n</tool_call>", "Hi", []),  # an empty block is no call
        ("Before.<tool_call>f</tool_call>\n<|observation|>", "Before.", [("f", "{}")]),
        ("Plain.<|user|>", "Plain.", []),
        ("<think>\nplan\n</think>\n\nAnswer.<|user|>", "Answer.", []),
    ],
)
@pytest.mark.parametrize("family", ["glm45", "glm47"])
def test_glm(family: str, text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser(family).parse(text)
    assert (turn.content, calls_of(turn)) == (content, calls)


def test_glm_schema_typing() -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "f",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "n": {"type": "integer"},
                        "s": {"type": "string"},
                        "b": {"type": "boolean"},
                        "o": {"type": "object"},
                    },
                },
            },
        }
    ]
    text = (
        "<tool_call>f<arg_key>n</arg_key><arg_value>three</arg_value><arg_key>s</arg_key><arg_value>42</arg_value>"
        "<arg_key>b</arg_key><arg_value>True</arg_value><arg_key>o</arg_key><arg_value>{'a': [1]}</arg_value>"
        "<arg_key>extra</arg_key><arg_value>[1, 2]</arg_value></tool_call>"
    )
    args = json.loads(get_parser("glm47", tools=tools).parse(text).tool_calls[0].function.arguments)
    # a wrong type is kept as the raw string for the tool to reject; keys outside the schema are typed by look
    assert args == {"n": "three", "s": "42", "b": True, "o": {"a": [1]}, "extra": [1, 2]}


# ---------------------------------------------------------------------------- llama4_json on the real template


@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_llama4_template_three_calls(as_string: bool) -> None:
    """The text goes in <|python_start|>...<|python_end|>, the calls follow back to back;
    `tojson` double-encodes OpenAI's string arguments."""
    reply = assistant("Let me look.", *three_calls(as_string))
    text = generated_text("llama4.jinja", [SYSTEM, USER], reply, "<|eot|>", tools=TOOLS, bos_token="<|begin_of_text|>")
    assert text.startswith('<|python_start|>Let me look.<|python_end|>{"name": "get_weather", "parameters": ')
    assert '}}{"name": "search"' in text or '"}{"name": "search"' in text

    turn = get_parser("llama4_json").parse(text)
    assert turn.content == "Let me look."
    assert calls_of(turn) == EXPECTED_THREE


def test_llama4_template_no_content() -> None:
    reply = assistant("", tool_call("get_weather", WEATHER))
    text = generated_text("llama4.jinja", [USER], reply, "<|eot|>", tools=TOOLS, bos_token="<|begin_of_text|>")
    assert text.startswith("<|python_start|><|python_end|>{")
    turn = get_parser("llama4").parse(text)
    assert turn.content is None
    assert calls_of(turn) == [("get_weather", compact(WEATHER))]


def test_llama4_template_plain_answer() -> None:
    text = generated_text(
        "llama4.jinja", [USER], assistant(ANSWER), "<|eot|>", tools=TOOLS, bos_token="<|begin_of_text|>"
    )
    turn = get_parser("llama4_json").parse(text)
    assert (turn.content, turn.tool_calls) == (ANSWER, [])


def test_llama4_template_truncated_anywhere() -> None:
    text = generated_text(
        "llama4.jinja",
        [USER],
        assistant("Let me look.", *three_calls()),
        "<|eot|>",
        tools=TOOLS,
        bos_token="<|begin_of_text|>",
    )
    parser = get_parser("llama4_json")
    for cut in range(len(text) + 1):
        turn = parser.parse(text[:cut])
        assert len(turn.tool_calls) <= 3
    # cut inside the last call's arguments: the first two are whole, the third is salvaged
    cut = text.index('"overwrite"')
    turn = parser.parse(text[:cut])
    assert turn.content == "Let me look."
    assert calls_of(turn)[:2] == EXPECTED_THREE[:2]
    assert turn.tool_calls[2].function.name == "write_file"


PS, PE = "<|python_start|>", "<|python_end|>"


@pytest.mark.parametrize(
    ("text", "content", "calls"),
    [
        (f'{PS}{PE}{{"name": "f", "parameters": {{"a": 1}}}}<|eot|>', None, [("f", '{"a":1}')]),
        (
            f'{PS}{{"name": "f", "parameters": {{"a": 1}}}}{PE}<|eom|>',
            None,
            [("f", '{"a":1}')],
        ),  # the call inside the block
        (
            f'{PS}[get_weather(city="Paris", days=3), search(query="x", strict=True)]{PE}',
            None,
            [("get_weather", '{"city":"Paris","days":3}'), ("search", '{"query":"x","strict":true}')],
        ),
        (f"{PS}[f(a=some_variable)]{PE}", None, [("f", "f(a=some_variable)")]),  # not a literal: kept raw
        (f"{PS}[f(a={{1, 2}})]{PE}", None, [("f", "f(a={1, 2})")]),  # a set is not JSON: kept raw
        (f"{PS}[1, 2, 3]{PE}", "[1, 2, 3]", []),  # a list that is not calls is content
        (f'Sure.{PS}Let me look.{PE}{{"name": "f", "parameters": {{}}}}', "Sure.\nLet me look.", [("f", "{}")]),
        (f'{PS}{PE}{{"name": "f", "parameters": {{}}}}\nDone.', "Done.", [("f", "{}")]),
        (f'{PS}{PE}{{"name": "f", "parameters": {{"a": 1,}}}}', None, [("f", '{"a": 1,}')]),  # broken: kept raw
        (
            f'{PS}{PE}{{"name": "f", "parameters": {{"a": 1}}}}{{"name": "g", "parameters": {{"b": ',
            None,
            [("f", '{"a":1}'), ("g", '{"b":')],
        ),
        (f'{PS}{{"name": "f", "parameters": {{"a": "cut', None, [("f", '{"a": "cut')]),  # no <|python_end|>
        (
            '{"name": "f", "parameters": {"a": 1}}; {"name": "g", "parameters": {}}',
            None,
            [("f", '{"a":1}'), ("g", "{}")],
        ),  # llama3 form
        ('{"name": "Alice", "age": 3}<|eot|>', '{"name": "Alice", "age": 3}', []),  # JSON, but not a call
        (f"{PS}print('hi'){PE}", "print('hi')", []),
        ("The answer is 4.<|eot|>", "The answer is 4.", []),
    ],
)
def test_llama4_json(text: str, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser("llama4_json").parse(text)
    assert (turn.content, calls_of(turn)) == (content, calls)


def test_llama4_python_tag_builtin_call_with_a_set_keeps_the_raw_arguments() -> None:
    turn = get_parser("llama4_json").parse("<|python_tag|>brave_search.call(query={1, 2})")
    assert [(c.function.name, c.function.arguments) for c in turn.tool_calls] == [("brave_search", "query={1, 2}")]


# ---------------------------------------------------------------------------- longcat on the documented format


@pytest.mark.parametrize("as_string", [False, True], ids=["dict-arguments", "string-arguments"])
def test_longcat_documented_format_three_calls(as_string: bool) -> None:
    """longcat_flash_documented.jinja is written from the documented format (no real LongCat
    template was available): JSON {"name", "arguments"} per <longcat_tool_call> block."""
    reply = assistant("Let me look.", *three_calls(as_string))
    text = generated_text("longcat_flash_documented.jinja", [SYSTEM, USER], reply, "</longcat_s>", tools=TOOLS)
    assert text.startswith('Let me look.<longcat_tool_call>\n{"name": "get_weather", "arguments": ')
    turn = get_parser("longcat").parse(text)
    assert turn.content == "Let me look."
    assert calls_of(turn) == EXPECTED_THREE


def test_longcat_documented_format_plain_answer_and_truncation() -> None:
    text = generated_text("longcat_flash_documented.jinja", [USER], assistant(ANSWER), "</longcat_s>", tools=TOOLS)
    assert get_parser("longcat").parse(text) == ParsedTurn(content=ANSWER)
    text = generated_text(
        "longcat_flash_documented.jinja", [USER], assistant("Let me look.", *three_calls()), "</longcat_s>", tools=TOOLS
    )
    assert_prefixes_parse("longcat", text, EXPECTED_THREE, re.escape(LC))


LO, LC = "<longcat_tool_call>", "</longcat_tool_call>"


@pytest.mark.parametrize(
    ("text", "reasoning", "content", "calls"),
    [
        (f'{LO}{{"name": "f", "arguments": {{"a": 1}}}}{LC}</longcat_s>', None, None, [("f", '{"a":1}')]),
        (
            f'{LO}{{"name": "f", "arguments": {{}}}}{LC}\n{LO}{{"name": "g", "arguments": {{"b": [1]}}}}{LC}',
            None,
            None,
            [("f", "{}"), ("g", '{"b":[1]}')],
        ),
        (f'{LO}{{"name": "f", "arguments": {{"a": 1}}}}', None, None, [("f", '{"a":1}')]),  # no close tag
        (f'{LO}{{"name": "f", "arguments": {{"a": "cut', None, None, [("f", '{"a": "cut')]),  # cut off
        (f'{LO}{{"name": "f", "arguments": "{{\\"a\\": 1}}"}}{LC}', None, None, [("f", '{"a":1}')]),  # double-encoded
        (f"{LO}not json{LC}", None, None, [("not json", "{}")]),  # bare text reads as a name (the Flash-Lite form)
        (f"{LO}{{broken{LC}", None, None, [("", "{broken")]),
        # LongCat-Flash-Lite's key/value form
        (
            f"Hi{LO}get_weather\n<longcat_arg_key>city</longcat_arg_key>\n<longcat_arg_value>Zürich</longcat_arg_value>\n{LC}",
            None,
            "Hi",
            [("get_weather", '{"city":"Zürich"}')],
        ),
        ("<longcat_think>plan</longcat_think>Answer.</longcat_s>", "plan", "Answer.", []),
        (f'<longcat_think>plan</longcat_think>{LO}{{"name": "f", "arguments": {{}}}}{LC}', "plan", None, [("f", "{}")]),
        ("<think>plan</think>Answer.", "plan", "Answer.", []),
        ("<tool_call>not a longcat tag</tool_call>", None, "<tool_call>not a longcat tag</tool_call>", []),
    ],
)
def test_longcat(text: str, reasoning: str | None, content: str | None, calls: list[tuple[str, str]]) -> None:
    turn = get_parser("longcat").parse(text)
    assert (turn.reasoning, turn.content, calls_of(turn)) == (reasoning, content, calls)


# ---------------------------------------------------------------------------- every new family


FAMILY_TWO_CALLS = {
    "kimi_k2": f'{KB}{CB}functions.a:0{AB}{{"x": 1}}{CE}{CB}functions.a:1{AB}{{"x": 1}}{CE}{KE}',
    "glm45": "<tool_call>a\n<arg_key>x</arg_key>\n<arg_value>1</arg_value>\n</tool_call>\n" * 2,
    "glm47": "<tool_call>a<arg_key>x</arg_key><arg_value>1</arg_value></tool_call>" * 2,
    "longcat": f'{LO}{{"name": "a", "arguments": {{"x": 1}}}}{LC}' * 2,
    "llama4_json": f'{PS}{PE}{{"name": "a", "parameters": {{"x": 1}}}}{{"name": "a", "parameters": {{"x": 1}}}}<|eot|>',
}

FAMILY_TOKENS = {
    "kimi_k2": [KB, KE, CB, AB, CE, "functions.", ":0", "<think>", "</think>"],
    "glm45": [
        "<tool_call>",
        "</tool_call>",
        "<arg_key>",
        "</arg_key>",
        "<arg_value>",
        "</arg_value>",
        "<|observation|>",
        "<think>",
        "</think>",
    ],
    "glm47": ["<tool_call>", "</tool_call>", "<arg_key>", "<arg_value>", "</arg_value>", "</think>"],
    "longcat": [
        LO,
        LC,
        "<longcat_arg_key>",
        "<longcat_arg_value>",
        "<longcat_think>",
        "</longcat_think>",
        "</longcat_s>",
    ],
    "llama4_json": [PS, PE, "<|eot|>", '{"name": ', '"parameters": ', "[f(a=", ")]", "<|python_tag|>"],
}
JSONISH = [
    "{",
    "}",
    "[",
    "]",
    '"',
    ":",
    ",",
    "\\",
    "\n",
    " ",
    "x",
    "1",
    "null",
    "NaN",
    "1e999",
    "'",
    "(",
    ")",
    "=",
    "{1, 2}",
    "é",
]


def test_new_families_are_registered() -> None:
    assert {"kimi_k2", "kimi", "glm45", "glm4_moe", "glm46", "glm47", "longcat", "llama4_json", "llama4"} <= set(
        parser_names()
    )
    assert type(get_parser("glm4_moe")) is type(get_parser("glm45"))
    assert type(get_parser("GLM47")) is not type(get_parser("glm45"))
    assert type(get_parser("Kimi-K2")) is type(get_parser("kimi_k2"))
    for name in ("kimi_k2", "glm45", "glm47", "longcat", "llama4_json"):
        assert get_parser(name).name == name


@pytest.mark.parametrize("family", sorted(FAMILY_TWO_CALLS))
def test_ids_are_deterministic_and_distinct(family: str) -> None:
    text = FAMILY_TWO_CALLS[family]
    first = get_parser(family).parse(text)
    assert calls_of(first) == [("a", '{"x":1}'), ("a", '{"x":1}')]
    ids = [call.id for call in first.tool_calls]
    assert ids == [make_call_id(text, 0), make_call_id(text, 1)]
    assert ids == [call.id for call in get_parser(family).parse(text).tool_calls]
    assert {call.id for call in get_parser(family).parse(text, id_seed="r/1").tool_calls}.isdisjoint(ids)


@pytest.mark.parametrize("family", sorted(FAMILY_TWO_CALLS))
def test_plain_text_is_content(family: str) -> None:
    assert get_parser(family).parse("Hello there.") == ParsedTurn(content="Hello there.")
    assert get_parser(family).parse("") == ParsedTurn()


@pytest.mark.parametrize("family", sorted(FAMILY_TOKENS))
def test_garbage_never_raises(family: str) -> None:
    """Random mixes of the family's own tokens and JSON-ish debris: parsing never raises,
    and every call has a string name and string arguments."""
    rng = random.Random(f"parser-fuzz-{family}")
    parser = get_parser(family, tools=TOOLS)
    pieces = FAMILY_TOKENS[family] + JSONISH
    for _ in range(400):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 30)))
        turn = parser.parse(text)
        for call in turn.tool_calls:
            assert isinstance(call.function.name, str) and isinstance(call.function.arguments, str)


# ---------------------------------------------------------------------------- the renderer


def test_renderer_matches_transformers() -> None:
    """The jinja environment above renders as transformers' apply_chat_template does (the
    Kimi-K2-Instruct/-Thinking templates are left out: transformers' immutable sandbox
    refuses their list.append)."""
    pytest.importorskip("transformers")
    from transformers.utils.chat_template_utils import render_jinja_template

    tool_turn = [USER, assistant("x", *three_calls(), reasoning="r"), tool_result()]
    cases = [
        ("glm4moe.jinja", tool_turn, {}),
        ("glm4_6.jinja", tool_turn, {}),
        ("glm4_7_flash.jinja", tool_turn, {}),
        ("llama4.jinja", [SYSTEM, *tool_turn], {"bos_token": "<|begin_of_text|>"}),
        ("moonshotai_kimi_k2.jinja", tool_turn, {}),
        ("longcat_flash_documented.jinja", tool_turn, {}),
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
