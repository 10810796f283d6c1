"""Env hooks that need no slot: loading a batch's items."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from envs import get_env
from temporal_rollouts.core.errors import activity_boundary
from temporal_rollouts.core.tasks import Item


class LoadItemsInput(BaseModel):
    env: str
    env_config: dict[str, Any] = Field(default_factory=dict)
    count: int
    offset: int = 0


class LoadedItems(BaseModel):
    items: list[Item]
    allow_network: bool


class EnvActivities:
    @activity.defn(name="load_items")
    async def load_items(self, input: LoadItemsInput) -> LoadedItems:
        with activity_boundary():
            env = get_env(input.env, input.env_config)
            return LoadedItems(items=env.load_items(input.count, input.offset), allow_network=env.allow_network)
