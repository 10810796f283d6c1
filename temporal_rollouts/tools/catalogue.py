"""The agent's tools: what the model is told about them, and how its calls become sandbox operations.

A bad tool call is part of the rollout, not a failure of the system: it is
repaired when the intent is unambiguous (double-encoded JSON, a bare command
string) and otherwise answered with a `ToolCallProblem` whose message the model
reads as the tool result. Nothing here raises for anything the model sent.

Bare-text arguments: a tool with exactly one required string parameter
(`terminal`, `read_file`, `search`) takes plain non-JSON text as that
parameter; other tools (`write_file`) answer with a problem. Text that looks
like a broken JSON object is never taken as plain text.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.messages import Message, ToolCall, ToolSpec
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_SESSION_TIMEOUT_S,
    ExecOp,
    Operation,
    ReadFileOp,
    SearchOp,
    SessionAction,
    SessionOp,
    ToolOutput,
    WriteFileOp,
)

WORKSPACE = "/workspace"
MAX_DECODE_DEPTH = 3
DEFAULT_KEYS_WAIT_S = 1.0
TMUX_ACTIONS: dict[str, SessionAction] = {
    "start": "start",
    "send_keys": "send_keys",
    "capture": "screen",
    "read": "read",
    "stop": "stop",
}


class ToolCallProblem(BaseModel):
    """Why a tool call was not run; `message` is what the model sees as the result."""

    kind: Literal["unknown_tool", "bad_arguments"]
    message: str


@dataclass(frozen=True)
class Param:
    name: str
    type: Literal["string", "integer"]
    description: str
    required: bool = True
    allow_empty: bool = False
    choices: tuple[str, ...] = ()


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    params: tuple[Param, ...]

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(
            name=self.name,
            description=self.description,
            parameters={
                "type": "object",
                "properties": {p.name: _property(p) for p in self.params},
                "required": [p.name for p in self.params if p.required],
            },
        )

    @property
    def sole_required_string(self) -> Param | None:
        required = [p for p in self.params if p.required]
        if len(required) == 1 and required[0].type == "string":
            return required[0]
        return None

    def usage(self) -> str:
        fields = ", ".join(f'"{p.name}" ({p.type}, {"required" if p.required else "optional"})' for p in self.params)
        return f"a JSON object with {fields}"


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            name="terminal",
            description=(
                f"Run a bash command in the sandbox and get its output (stdout and stderr) and exit code. "
                f"Each call starts a new shell in {WORKSPACE}, so `cd` and exported variables do not carry over. "
                "Commands cannot read interactive input and are killed when they run past their timeout. "
                "Background processes (`&`) are stopped when the command finishes, so start a server "
                "and use it in the same command."
            ),
            params=(
                Param("command", "string", "The bash command to run."),
                Param("timeout", "integer", "Seconds before the command is killed; omit for the default.", False),
            ),
        ),
        Tool(
            name="terminal_stateful",
            description=(
                f"Run a bash command in your persistent shell session (it starts in {WORKSPACE} on first use). "
                "Unlike `terminal`, the working directory, exported variables, activated environments and "
                "background processes (`server &`) carry over to later calls. Returns the command's output "
                "and exit code; a command still running at its timeout is interrupted with Ctrl-C."
            ),
            params=(
                Param("command", "string", "The bash command to run in the session."),
                Param("timeout", "integer", "Seconds to wait for the command; omit for the default.", False),
            ),
        ),
        Tool(
            name="tmux",
            description=(
                "Drive your persistent terminal session like a keyboard, for interactive programs (a REPL, a "
                "prompt that asks questions). Actions: `start` the session; `send_keys` types `keys` "
                "(literal text, add \\n to press Enter, or one key name: Enter, C-c, C-d, C-z, Escape, Tab, "
                "Up, Down, Left, Right, BSpace) and returns what the terminal printed; `capture` shows the "
                "last lines of the screen; `read` returns output printed since the last read; `stop` ends "
                "the session and everything it started. It is the same session as `terminal_stateful`."
            ),
            params=(
                Param("action", "string", "One of start, send_keys, capture, read, stop.", choices=tuple(TMUX_ACTIONS)),
                Param("keys", "string", "For send_keys: the text or key name to type.", False, allow_empty=True),
                Param("wait", "integer", "For send_keys: seconds to wait for output; default 1.", False),
            ),
        ),
        Tool(
            name="read_file",
            description=f"Read a text file. Paths are relative to {WORKSPACE}; absolute paths must be inside it.",
            params=(Param("path", "string", f"File path, relative to {WORKSPACE}."),),
        ),
        Tool(
            name="write_file",
            description=(
                "Create or overwrite a text file with exactly the given content; missing parent directories "
                f"are created. Paths are relative to {WORKSPACE}; absolute paths must be inside it."
            ),
            params=(
                Param("path", "string", f"File path, relative to {WORKSPACE}."),
                Param("content", "string", "The complete new content of the file.", allow_empty=True),
            ),
        ),
        Tool(
            name="search",
            description=(
                f"Search the files under a directory of {WORKSPACE} for lines matching a Perl-style "
                "regular expression; each match is shown with its file and line number."
            ),
            params=(
                Param("pattern", "string", "Regular expression to look for."),
                Param("path", "string", f'Directory or file to search, relative to {WORKSPACE}; default ".".', False),
            ),
        ),
    )
}
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)


def tool_specs(names: Sequence[str]) -> list[ToolSpec]:
    """Specs of the named tools, in the given order; an unknown name is a `ConfigError`."""
    return [tool.spec for tool in _tools(names)]


def parse_tool_call(
    call: ToolCall,
    allowed: Sequence[str],
    *,
    default_timeout_s: float,
    max_timeout_s: float = 600.0,
) -> Operation | ToolCallProblem:
    """The sandbox operation a model's tool call asks for, or the problem to tell the model about."""
    available = _tools(allowed)
    name = call.function.name.strip()
    tool = next((t for t in available if t.name == name), None)
    if tool is None:
        listing = ", ".join(t.name for t in available) or "none"
        message = f"Error: unknown tool {name!r}. Available tools: {listing}."
        return ToolCallProblem(kind="unknown_tool", message=message)

    arguments = _decode_arguments(tool, call.function.arguments)
    if isinstance(arguments, dict):
        arguments = _validate(tool, arguments)
    if isinstance(arguments, str):
        message = f"Error: invalid arguments for {tool.name}: {arguments}. Expected {tool.usage()}."
        return ToolCallProblem(kind="bad_arguments", message=message)

    if tool.name == "terminal":
        timeout = arguments.get("timeout")
        timeout_s = default_timeout_s if timeout is None else min(max(float(timeout), 1.0), max_timeout_s)
        return ExecOp(command=arguments["command"], timeout_s=timeout_s, resident=True)
    if tool.name == "terminal_stateful":
        timeout = arguments.get("timeout")
        timeout_s = DEFAULT_SESSION_TIMEOUT_S if timeout is None else min(max(float(timeout), 1.0), max_timeout_s)
        return SessionOp(action="run", text=arguments["command"], timeout_s=timeout_s)
    if tool.name == "tmux":
        action = TMUX_ACTIONS[arguments["action"]]
        if action == "send_keys" and not arguments.get("keys"):
            message = f'Error: invalid arguments for tmux: send_keys needs "keys". Expected {tool.usage()}.'
            return ToolCallProblem(kind="bad_arguments", message=message)
        wait = arguments.get("wait")
        wait_s = DEFAULT_KEYS_WAIT_S if wait is None else min(max(float(wait), 0.1), max_timeout_s)
        return SessionOp(action=action, text=arguments.get("keys") or "", timeout_s=wait_s)
    if tool.name == "read_file":
        return ReadFileOp(path=arguments["path"])
    if tool.name == "write_file":
        return WriteFileOp(path=arguments["path"], content=arguments["content"])
    return SearchOp(pattern=arguments["pattern"], path=arguments.get("path") or ".", resident=True)


def tool_result_message(call_id: str, output: ToolOutput | ToolCallProblem) -> Message:
    """The tool message the model reads for one call: the output, then notes for a failed
    exit code, a timeout and truncation (a search with no matches is not a failure)."""
    if isinstance(output, ToolCallProblem):
        return Message(role="tool", tool_call_id=call_id, content=output.message)
    text = output.output
    if not output.ok and output.exit_code is None and not output.timed_out:
        text = f"Error: {text}"
    lines = [text] if text else ["(no output)"]
    if output.timed_out:
        lines.append("[timed out: the command was killed]")
    elif not output.ok and output.exit_code not in (None, 0):
        lines.append(f"[exit code: {output.exit_code}]")
    if output.truncated:
        lines.append("[output truncated]")
    return Message(role="tool", tool_call_id=call_id, content="\n".join(lines))


def _tools(names: Sequence[str]) -> list[Tool]:
    unknown = [name for name in names if name not in TOOLS]
    if unknown:
        raise ConfigError(f"unknown tools {unknown}: known tools are {list(TOOL_NAMES)}")
    return [TOOLS[name] for name in dict.fromkeys(names)]


def _decode_arguments(tool: Tool, raw: str) -> dict[str, Any] | str:
    """Arguments as an object, or the reason they cannot be read."""
    text = raw
    for _ in range(MAX_DECODE_DEPTH):
        if not text.strip():
            return {}
        try:
            value = json.loads(text, strict=False)
        except ValueError as exc:
            return _bare_text_arguments(tool, text, exc)
        if value is None:
            return {}
        if isinstance(value, dict):
            return value
        if not isinstance(value, str):
            return f"arguments must be a JSON object, not {_json_type(value)}"
        text = value
    return "arguments are JSON-encoded too many times"


def _bare_text_arguments(tool: Tool, text: str, error: ValueError) -> dict[str, Any] | str:
    stripped = text.strip()
    if _looks_like_json_object(stripped):
        return f"arguments are not valid JSON ({error})"
    param = tool.sole_required_string
    if param is None:
        return "arguments must be a JSON object, not plain text"
    return {param.name: stripped}


def _looks_like_json_object(text: str) -> bool:
    return text.startswith("{") and text[1:].lstrip()[:1] in ('"', "'", "}", "")


def _validate(tool: Tool, arguments: dict[str, Any]) -> dict[str, Any] | str:
    values: dict[str, Any] = {}
    for param in tool.params:
        value = arguments.get(param.name)
        if value is None:
            if param.required:
                return f"missing required argument {param.name!r}"
            continue
        if param.type == "string":
            if not isinstance(value, str):
                return f"argument {param.name!r} must be a string, not {_json_type(value)}"
            if not param.allow_empty and not value.strip():
                return f"argument {param.name!r} must not be empty"
            if param.choices and value.strip() not in param.choices:
                return f"argument {param.name!r} must be one of {', '.join(param.choices)}, not {value!r}"
            if param.choices:
                value = value.strip()
        elif isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return f"argument {param.name!r} must be a number, not {_json_type(value)}"
        values[param.name] = value
    return values


def _property(param: Param) -> dict[str, Any]:
    described: dict[str, Any] = {"type": param.type, "description": param.description}
    if param.choices:
        described["enum"] = list(param.choices)
    return described


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value}"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"
