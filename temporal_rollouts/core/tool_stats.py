"""What a rollout's tool calls came to: each failed call, and the calls counted by outcome.

Apart from the records of rollouts so that a fork can carry its prefix's counts
(core.forks) without importing the records that carry forks.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel


class ToolErrorRecord(BaseModel):
    turn: int
    tool_name: str
    arguments: str
    error: str


ToolCallOutcome = Literal["invalid", "ok", "error"]
"""One tool call: not schema-valid (unknown tool, bad arguments), run fine, or run and failed."""


class ToolStats(BaseModel):
    """A rollout's tool calls, counted as the original counted them. A command that ran and exited
    non-zero is `executed_ok` (a failing test run is information); `execution_errors` are calls the
    tool itself failed (a timeout, a missing file, a lost terminal session)."""

    attempted: int = 0
    schema_valid: int = 0
    executed_ok: int = 0
    execution_errors: int = 0

    def record(self, outcome: ToolCallOutcome) -> None:
        self.attempted += 1
        if outcome != "invalid":
            self.schema_valid += 1
            if outcome == "ok":
                self.executed_ok += 1
            else:
                self.execution_errors += 1

    @classmethod
    def total(cls, stats: list[ToolStats]) -> ToolStats:
        return cls(**{name: sum(getattr(s, name) for s in stats) for name in cls.model_fields})
