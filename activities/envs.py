"""Env hooks that need no slot: checking a batch against the worker's limits, and reading
its items one page at a time (a batch never holds more than a page of items)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from temporalio import activity

from envs import get_env
from envs.base import as_loaded
from temporal_rollouts.core.errors import ConfigError, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item

MAX_PAGE_ITEMS = 10_000
"""One page of items travels in one activity result; larger requests are refused."""


def check_items_fit(env: str, item_count: int | None, num_items: int, offset: int, cycle: bool) -> None:
    """A batch's items lie inside the env's task set, unless it asked to go round it again."""
    if item_count is None:
        return
    if offset >= item_count:
        raise ConfigError(
            f"item_offset: {offset} is past the end of env {env!r}, which has {item_count} items "
            f"(offsets 0..{item_count - 1})"
        )
    if not cycle and offset + num_items > item_count:
        room = item_count - offset
        raise ConfigError(
            f"num_items: {num_items} items from offset {offset} run past the end of env {env!r}, which has "
            f"{item_count} items: ask for at most {room}, or go round the task set again with cycle_items "
            f"(`rollouts batch --cycle`), which repeats tasks"
        )


def distinct_items(item_count: int | None, num_items: int) -> int:
    return num_items if item_count is None else min(num_items, item_count)


class BatchShape(BaseModel):
    """What the first page checks against the worker's settings before the batch does any work."""

    model_config = ConfigDict(extra="forbid")

    num_items: int
    group_size: int
    policy: str | None = None
    max_concurrency: int | None = None
    cycle_items: bool = False


class LoadItemsInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: str
    env_config: dict[str, Any] = Field(default_factory=dict)
    count: int = Field(ge=0, le=MAX_PAGE_ITEMS)
    offset: int = Field(default=0, ge=0)
    check: BatchShape | None = Field(default=None, description="Sent with a batch's first page only.")


class LoadedItems(BaseModel):
    items: list[Item]
    allow_network: bool
    item_count: int | None = Field(default=None, description="The env's distinct items; None: no end.")


class EnvActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @activity.defn(name="load_items")
    @checked_input
    async def load_items(self, input: LoadItemsInput) -> LoadedItems:
        with activity_boundary():
            env = get_env(input.env, input.env_config)
            item_count = env.item_count()
            if input.check is not None:
                self._check_batch(input, item_count)
            items = as_loaded(env, env.load_items(input.count, input.offset))
            return LoadedItems(items=items, allow_network=env.allow_network, item_count=item_count)

    def _check_batch(self, input: LoadItemsInput, item_count: int | None) -> None:
        shape = input.check
        assert shape is not None
        rollouts = shape.num_items * shape.group_size
        limit = self._settings.max_batch_rollouts
        if rollouts > limit:
            raise ConfigError(
                f"num_items: {shape.num_items} items x group_size {shape.group_size} = {rollouts} rollouts, "
                f"over this worker's limit of {limit} (settings max_batch_rollouts)"
            )
        if shape.max_concurrency is not None and shape.max_concurrency > self._settings.max_batch_concurrency:
            raise ConfigError(
                f"max_concurrency: {shape.max_concurrency} rollouts at once is over this worker's limit of "
                f"{self._settings.max_batch_concurrency} (settings max_batch_concurrency)"
            )
        check_items_fit(input.env, item_count, shape.num_items, input.offset, shape.cycle_items)
        self._settings.policy_endpoint(shape.policy)
