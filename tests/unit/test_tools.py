"""Unit tests of the tool catalogue, tool-call repair and validation, and tool-result rendering."""

from __future__ import annotations

import json

import pytest

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import FunctionCall, ToolCall
from temporal_rollouts.sandbox_server.schema import ExecOp, ReadFileOp, SearchOp, SessionOp, ToolOutput, WriteFileOp
from temporal_rollouts.tools.catalogue import (
    TOOL_NAMES,
    ToolCallProblem,
    parse_tool_call,
    tool_result_message,
    tool_specs,
)

ALL = ("terminal", "read_file", "write_file", "search")


def call(name: str, arguments: str | dict) -> ToolCall:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id="call_1", function=FunctionCall(name=name, arguments=raw))


def parse(name: str, arguments: str | dict, allowed: tuple[str, ...] = ALL, **kwargs: float):
    return parse_tool_call(call(name, arguments), allowed, default_timeout_s=kwargs.pop("default", 60.0), **kwargs)


def problem(name: str, arguments: str | dict, allowed: tuple[str, ...] = ALL) -> ToolCallProblem:
    result = parse(name, arguments, allowed)
    assert isinstance(result, ToolCallProblem), result
    return result


def test_catalogue_is_the_env_default_and_in_openai_shape() -> None:
    assert TOOL_NAMES == ("terminal", "terminal_stateful", "tmux", "read_file", "write_file", "search")
    specs = tool_specs(["search", "terminal"])
    assert [s.name for s in specs] == ["search", "terminal"]
    terminal = specs[1].to_openai()
    assert terminal["type"] == "function"
    parameters = terminal["function"]["parameters"]
    assert parameters["type"] == "object"
    assert parameters["required"] == ["command"]
    assert parameters["properties"]["timeout"]["type"] == "integer"
    assert specs[0].parameters["required"] == ["pattern"]
    by_name = {s.name: s for s in tool_specs(ALL)}
    assert by_name["write_file"].parameters["required"] == ["path", "content"]
    assert all("/workspace" in s.description for s in by_name.values())


def test_unknown_tool_name_in_config_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="browser"):
        tool_specs(["terminal", "browser"])
    with pytest.raises(ConfigError):
        parse_tool_call(call("terminal", {"command": "ls"}), ["terminal", "browser"], default_timeout_s=60)


def test_well_formed_calls_become_operations() -> None:
    assert parse("terminal", {"command": "ls -la"}, default=42.0) == ExecOp(
        command="ls -la", timeout_s=42.0, resident=True
    )
    assert parse("read_file", {"path": "src/a.py"}) == ReadFileOp(path="src/a.py")
    assert parse("write_file", {"path": "b.txt", "content": "x\n"}) == WriteFileOp(path="b.txt", content="x\n")
    assert parse("search", {"pattern": "def \\w+", "path": "src"}) == SearchOp(
        pattern="def \\w+", path="src", resident=True
    )
    assert parse("search", {"pattern": "TODO"}) == SearchOp(pattern="TODO", path=".", resident=True)


def test_unknown_keys_are_ignored_and_null_optionals_are_defaults() -> None:
    assert parse("terminal", {"command": "pwd", "cwd": "/tmp", "timeout": None}) == ExecOp(
        command="pwd", timeout_s=60, resident=True
    )
    assert parse("search", {"pattern": "x", "path": None}) == SearchOp(pattern="x", path=".", resident=True)


def test_double_encoded_arguments_are_decoded_twice() -> None:
    once = json.dumps({"command": "echo hi", "timeout": 5})
    assert parse("terminal", json.dumps(once)) == ExecOp(command="echo hi", timeout_s=5, resident=True)
    write = json.dumps(json.dumps({"path": "a.txt", "content": "A"}))
    assert parse("write_file", write) == WriteFileOp(path="a.txt", content="A")


def test_bare_string_is_the_terminal_command() -> None:
    assert parse("terminal", "ls -la /workspace") == ExecOp(command="ls -la /workspace", timeout_s=60, resident=True)
    assert parse("terminal", json.dumps("cat a.txt | wc -l")) == ExecOp(
        command="cat a.txt | wc -l", timeout_s=60, resident=True
    )
    assert parse("terminal", "{ echo a; echo b; } > out.txt") == ExecOp(
        command="{ echo a; echo b; } > out.txt", resident=True
    )


def test_bare_string_fills_a_sole_required_string_parameter() -> None:
    assert parse("read_file", "  notes/todo.md\n") == ReadFileOp(path="notes/todo.md")
    assert parse("search", "class \\w+") == SearchOp(pattern="class \\w+", resident=True)


def test_bare_string_for_write_file_is_a_problem_naming_its_arguments() -> None:
    result = problem("write_file", "print('hello')")
    assert result.kind == "bad_arguments"
    assert "write_file" in result.message and "not plain text" in result.message
    assert '"path" (string, required)' in result.message and '"content" (string, required)' in result.message


@pytest.mark.parametrize(
    ("name", "arguments"),
    [
        ("write_file", '{"path": "a.py", "content": "x = 1'),
        ("write_file", "{'path': 'a.py', 'content': 'x'}"),
        ("terminal", '{"command": "ls'),
        ("terminal", "{}}"),
    ],
)
def test_broken_json_object_is_a_problem_not_plain_text(name: str, arguments: str) -> None:
    result = problem(name, arguments)
    assert result.kind == "bad_arguments"
    assert "not valid JSON" in result.message


def test_raw_newlines_inside_json_strings_are_accepted() -> None:
    arguments = '{"path": "a.py", "content": "line one\nline two\n"}'
    assert parse("write_file", arguments) == WriteFileOp(path="a.py", content="line one\nline two\n")


@pytest.mark.parametrize(
    ("arguments", "wording"), [("[1, 2]", "an array"), ("42", "the number 42"), ("true", "a boolean")]
)
def test_non_object_json_is_a_problem(arguments: str, wording: str) -> None:
    result = problem("terminal", arguments)
    assert "must be a JSON object" in result.message and wording in result.message


@pytest.mark.parametrize("arguments", ["", "   ", "null", "{}", '""'])
def test_empty_arguments_report_the_missing_argument(arguments: str) -> None:
    result = problem("read_file", arguments)
    assert "missing required argument 'path'" in result.message
    assert '"path" (string, required)' in result.message


@pytest.mark.parametrize(
    ("name", "arguments", "wording"),
    [
        ("terminal", {"command": 123}, "'command' must be a string, not the number 123"),
        ("terminal", {"command": ["ls"]}, "'command' must be a string, not an array"),
        ("terminal", {"command": "ls", "timeout": "30"}, "'timeout' must be a number, not a string"),
        ("terminal", {"command": "ls", "timeout": True}, "'timeout' must be a number, not a boolean"),
        ("terminal", {"command": "   "}, "'command' must not be empty"),
        ("write_file", {"path": "a.json", "content": {"k": 1}}, "'content' must be a string, not an object"),
        ("write_file", {"path": "a.txt"}, "missing required argument 'content'"),
        ("search", {"pattern": "x", "path": 3}, "'path' must be a string"),
    ],
)
def test_wrong_types_and_missing_arguments_are_problems(name: str, arguments: dict, wording: str) -> None:
    result = problem(name, arguments)
    assert result.kind == "bad_arguments"
    assert wording in result.message
    assert result.message.startswith(f"Error: invalid arguments for {name}")


def test_non_finite_timeout_is_a_problem() -> None:
    assert "'timeout' must be a number" in problem("terminal", '{"command": "ls", "timeout": Infinity}').message


def test_empty_file_content_is_allowed() -> None:
    assert parse("write_file", {"path": "empty.txt", "content": ""}) == WriteFileOp(path="empty.txt", content="")


@pytest.mark.parametrize(("timeout", "expected"), [(5000, 600.0), (0, 1.0), (-3, 1.0), (12.5, 12.5), (30, 30.0)])
def test_terminal_timeout_is_clamped(timeout: float, expected: float) -> None:
    result = parse("terminal", {"command": "sleep 1", "timeout": timeout})
    assert isinstance(result, ExecOp) and result.timeout_s == expected


def test_terminal_timeout_clamp_honours_max_timeout() -> None:
    result = parse("terminal", {"command": "make", "timeout": 900}, max_timeout_s=120.0)
    assert isinstance(result, ExecOp) and result.timeout_s == 120.0


def test_background_commands_are_allowed() -> None:
    command = "python -m http.server 8000 > server.log 2>&1 &"
    assert parse("terminal", {"command": command}) == ExecOp(command=command, timeout_s=60, resident=True)


def test_unknown_tool_lists_the_available_tools() -> None:
    result = problem("browse", {"url": "x"}, allowed=("terminal", "read_file"))
    assert result.kind == "unknown_tool"
    assert result.message == "Error: unknown tool 'browse'. Available tools: terminal, read_file."


def test_a_known_tool_that_is_not_allowed_is_unknown_to_the_model() -> None:
    result = problem("write_file", {"path": "a", "content": "b"}, allowed=("read_file",))
    assert result.kind == "unknown_tool" and "Available tools: read_file." in result.message


def test_tool_name_whitespace_is_forgiven() -> None:
    assert parse(" read_file\n", {"path": "a"}) == ReadFileOp(path="a")


def output(**fields) -> ToolOutput:
    return ToolOutput(call_id="call_1", **{"ok": True, "output": "", **fields})


@pytest.mark.parametrize(
    ("result", "expected"),
    [
        (output(output="hello\n", exit_code=0), "hello\n"),
        (output(ok=False, output="No such file", exit_code=2), "No such file\n[exit code: 2]"),
        (output(), "(no output)"),
        (
            output(ok=False, output="partial", exit_code=-9, timed_out=True),
            "partial\n[timed out: the command was killed]",
        ),
        (
            output(ok=False, output="head...tail", truncated=True, exit_code=1),
            "head...tail\n[exit code: 1]\n[output truncated]",
        ),
        (output(ok=False, output="path escapes the workspace"), "Error: path escapes the workspace"),
        (output(output="no matches", exit_code=1), "no matches"),
        (output(output="file text", replayed=True), "file text"),
    ],
)
def test_tool_outputs_are_rendered_for_the_model(result: ToolOutput, expected: str) -> None:
    message = tool_result_message("call_9", result)
    assert message.role == "tool" and message.tool_call_id == "call_9"
    assert message.content == expected


def test_problems_are_rendered_verbatim() -> None:
    found = problem("nope", "{}")
    message = tool_result_message("call_2", found)
    assert message.to_openai() == {"role": "tool", "tool_call_id": "call_2", "content": found.message}


STATEFUL = ("terminal_stateful", "tmux")


def test_stateful_terminal_calls_become_session_operations() -> None:
    assert parse("terminal_stateful", {"command": "cd src"}, STATEFUL) == SessionOp(action="run", text="cd src")
    assert parse("terminal_stateful", {"command": "make", "timeout": 5000}, STATEFUL).timeout_s == 600.0
    assert parse("terminal_stateful", "ls -la", STATEFUL) == SessionOp(action="run", text="ls -la")
    assert parse("tmux", {"action": "capture"}, STATEFUL) == SessionOp(action="screen", timeout_s=1.0)
    assert parse("tmux", "read", STATEFUL).action == "read"
    keys = parse("tmux", {"action": "send_keys", "keys": "C-c", "wait": 3}, STATEFUL)
    assert keys == SessionOp(action="send_keys", text="C-c", timeout_s=3.0)
    spec = {s.name: s for s in tool_specs(STATEFUL)}["tmux"].parameters
    assert spec["properties"]["action"]["enum"] == ["start", "send_keys", "capture", "read", "stop"]


def test_bad_stateful_terminal_calls_are_problems_the_model_reads() -> None:
    assert "must be one of start, send_keys" in problem("tmux", {"action": "attach"}, STATEFUL).message
    assert "send_keys needs" in problem("tmux", {"action": "send_keys"}, STATEFUL).message
    assert "missing required argument 'command'" in problem("terminal_stateful", {}, STATEFUL).message
