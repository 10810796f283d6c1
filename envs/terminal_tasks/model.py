"""The data model of one terminal task, as `loader` reads it from its Harbor task folder.

Multi-line text (a check script, a file's content) may also be given as a list of
lines, each ending in a newline (tests build tasks so).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from temporal_rollouts.core.tasks import ScriptedCall


def _join_lines(value: Any) -> Any:
    if isinstance(value, list) and all(isinstance(line, str) for line in value):
        return "".join(f"{line}\n" for line in value)
    return value


class TerminalTask(BaseModel):
    """A small shell task: files to start from, a bash check, and a reference solution."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    prompt: str
    files: dict[str, str] = Field(
        default_factory=dict, description="Workspace-relative path -> content, written at setup."
    )
    executable: tuple[str, ...] = Field(default=(), description="Paths from `files` to mark executable at setup.")
    check: str = Field(description="Bash script run in /workspace; exits 0 iff the task is solved.")
    check_in_session: bool = Field(
        default=False,
        description="Run the check inside the agent's stateful terminal (same processes and network), for "
        "tasks whose result is a running server or job rather than files.",
    )
    solution: tuple[tuple[ScriptedCall, ...], ...] = Field(description="Turns of tool calls that solve the task.")
    context: str | None = Field(
        default=None,
        description="The task's image: the absolute path of its build context (its folder's `environment/`); "
        "None runs on the sandbox server's own root.",
    )

    @field_validator("check", mode="before")
    @classmethod
    def _check_lines(cls, value: Any) -> Any:
        return _join_lines(value)

    @field_validator("files", mode="before")
    @classmethod
    def _file_lines(cls, value: Any) -> Any:
        if isinstance(value, dict):
            return {path: _join_lines(content) for path, content in value.items()}
        return value

    @field_validator("files")
    @classmethod
    def _relative_paths(cls, files: dict[str, str]) -> dict[str, str]:
        for path in files:
            if path.startswith("/") or ".." in path.split("/"):
                raise ValueError(f"file path {path!r} must be relative to the workspace")
        return files

    @field_validator("executable")
    @classmethod
    def _executable_known(cls, paths: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        unknown = [p for p in paths if p not in info.data.get("files", {})]
        if unknown:
            raise ValueError(f"executable paths not in files: {unknown}")
        return paths

    def turns(self) -> list[list[ScriptedCall]]:
        return [[call.model_copy(deep=True) for call in turn] for turn in self.solution]
