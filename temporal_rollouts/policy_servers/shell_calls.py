"""Reference solutions played to a harness: our tools' calls written as commands for its shell tool.

The demo policy's solutions call our tools (`terminal`, `write_file`, ...). A harness offers its
own, usually one shell tool (the minimal harness's and mini-swe-agent's `bash`), so a scripted
call becomes the command that does the same in a shell. A harness ends in its own way too: ours
when a reply calls no tool, mini-swe-agent when its shell runs the submit command its prompt names
(`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`), which `submit_command` finds.
"""

from __future__ import annotations

import re
import shlex
from typing import Any

SUBMIT = re.compile(r"`(echo [A-Z][A-Z_]{7,})`")
"""A command in backticks that echoes one upper-case word: how mini-swe-agent's prompt says to finish."""


def shell_tool(tools: list[Any]) -> tuple[str, str] | None:
    """(name, argument) of the offered tool that takes one required string: a shell; None if there is none."""
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        parameters = function.get("parameters") if isinstance(function, dict) else None
        if not isinstance(parameters, dict):
            continue
        required = parameters.get("required") or []
        properties = parameters.get("properties") or {}
        if len(required) == 1 and (properties.get(required[0]) or {}).get("type") == "string":
            return str(function["name"]), str(required[0])
    return None


def as_shell(name: str, arguments: dict[str, Any]) -> str | None:
    """The shell command that does what the call to our tool `name` does; None for a tool it cannot write."""
    if name in ("terminal", "terminal_stateful") and isinstance(arguments.get("command"), str):
        return arguments["command"]
    path = arguments.get("path")
    if name == "write_file" and isinstance(path, str) and isinstance(arguments.get("content"), str):
        quoted = shlex.quote(path)
        return f'mkdir -p "$(dirname {quoted})" && printf %s {shlex.quote(arguments["content"])} > {quoted}'
    if name == "read_file" and isinstance(path, str):
        return f"cat {shlex.quote(path)}"
    if name == "search" and isinstance(arguments.get("pattern"), str):
        return f"grep -rnP {shlex.quote(arguments['pattern'])} {shlex.quote(path or '.')}"
    return None


def submit_command(prompts: list[str]) -> str | None:
    """The finishing command a harness's prompts name, if any."""
    for text in prompts:
        if found := SUBMIT.search(text):
            return found.group(1)
    return None
