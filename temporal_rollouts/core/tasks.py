"""A task as the workflow carries it, a verifier's verdict, and a scripted reference call.

Plain data shared by envs, activities, workflows and the demo policy; env code itself
lives in `envs/` and runs only inside activities.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from temporal_rollouts.core.images import ImageSpec


class ItemTimeouts(BaseModel):
    """An item's own timeouts (a Harbor task's `[agent]` and `[verifier] timeout_sec`): they narrow the
    batch's, never widen them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    agent_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """The agent's budget: the rollout's `wall_clock_s` when that is longer."""
    verify_s: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    """How long the env's verifier may take; the verify step's own timeout is set to outlast it."""


class Item(BaseModel):
    """One task, as the workflow carries it: an id plus small JSON data, and the image it runs in."""

    model_config = ConfigDict(frozen=True)

    id: str
    data: dict[str, Any] = Field(default_factory=dict)
    image: ImageSpec | None = None
    """The image the item's slots run in, as the env's `image` hook named it when the item was loaded;
    None runs on the sandbox server's own root, as every item did before images."""
    timeouts: ItemTimeouts | None = None
    """The item's own timeouts, as the env's `timeouts` hook named them when the item was loaded."""


class Verdict(BaseModel):
    score: float
    details: dict[str, Any] = Field(default_factory=dict)


class ScriptedCall(BaseModel):
    """A tool call in a reference solution, played by the demo policy."""

    name: str
    arguments: dict[str, Any]
