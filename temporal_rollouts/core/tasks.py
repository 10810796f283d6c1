"""A task as the workflow carries it, a verifier's verdict, and a scripted reference call.

Plain data shared by envs, activities, workflows and the demo policy; env code itself
lives in `envs/` and runs only inside activities.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from temporal_rollouts.core.images import ImageSpec


class Item(BaseModel):
    """One task, as the workflow carries it: an id plus small JSON data, and the image it runs in."""

    model_config = ConfigDict(frozen=True)

    id: str
    data: dict[str, Any] = Field(default_factory=dict)
    image: ImageSpec | None = None
    """The image the item's slots run in, as the env's `image` hook named it when the item was loaded;
    None runs on the sandbox server's own root, as every item did before images."""


class Verdict(BaseModel):
    score: float
    details: dict[str, Any] = Field(default_factory=dict)


class ScriptedCall(BaseModel):
    """A tool call in a reference solution, played by the demo policy."""

    name: str
    arguments: dict[str, Any]
