"""The chat transcript in OpenAI's wire shape, shared by envs, tools, model clients and workflows,
with the cheap token estimate that context budgets use."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class FunctionCall(BaseModel):
    name: str
    arguments: str = Field(default="{}", description="Raw JSON text exactly as the model produced it.")


class ToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Message(BaseModel):
    model_config = ConfigDict(extra="ignore")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    name: str | None = None
    reasoning_content: str | None = Field(
        default=None, description="The model's reasoning text, kept for templates that render it."
    )

    def to_openai(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


class ToolSpec(BaseModel):
    """One tool in OpenAI's `tools=[...]` format."""

    name: str
    description: str
    parameters: dict[str, Any]

    def to_openai(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }


CHARS_PER_TOKEN = 4
PER_MESSAGE_TOKENS = 10
PER_TOOL_CALL_TOKENS = 50


def estimate_tokens(messages: Iterable[Message]) -> int:
    """The original system's estimate: len(content)//4 + 10 per message, +50 per tool call."""
    total = 0
    for message in messages:
        text = (message.content or "") + (message.reasoning_content or "")
        total += len(text) // CHARS_PER_TOKEN + PER_MESSAGE_TOKENS
        for call in message.tool_calls or []:
            total += PER_TOOL_CALL_TOKENS + len(call.function.arguments) // CHARS_PER_TOKEN
    return total
