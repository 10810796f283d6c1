"""What a task family (an env) provides, and the handle its hooks use to touch a slot.

Env code runs only inside activities: the workflow sees items as plain data and
never imports an env. Setup and verify get a `SlotHandle`, which is the sandbox's
`LeasedSlot` (`temporal_rollouts.sandbox.handle`): its docstring lists what a hook
may do and says how calls are keyed so that a retried hook is answered from the
sandbox's stored results instead of running twice.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, ClassVar

from temporal_rollouts.core.errors import BadItem
from temporal_rollouts.core.images import ImageSpec
from temporal_rollouts.core.harness import HarnessSpec
from temporal_rollouts.core.messages import Message, ToolSpec
from temporal_rollouts.core.tasks import Item, ItemTimeouts, ScriptedCall, Verdict
from temporal_rollouts.sandbox.handle import LeasedSlot as SlotHandle

__all__ = ["Env", "ImageSpec", "Item", "ItemTimeouts", "ScriptedCall", "SlotHandle", "Verdict", "as_loaded"]


class Env(ABC):
    """A task family. Subclasses set `name` and are registered in `envs.registry`.

    Two config keys work for every env: `tools` (names from the tool catalogue, e.g. as
    resolved from toolsets by `envs.toolsets`) narrows what the model is offered, and
    `system_prompt` replaces the env's own.
    """

    name: ClassVar[str]
    allow_network: ClassVar[bool] = False
    sandbox_limits: ClassVar[dict[str, float]] = {}
    """Limits for this env's slots, narrower than the sandbox server's, by `SandboxSettings` name
    (`memory_limit_mb`, `max_processes`, `cpus`, `cpu_time_limit_s`, `file_size_limit_mb`,
    `tmp_limit_mb`, `disk_limit_mb`). Read on the worker; they can never widen the server's."""
    tool_names: ClassVar[tuple[str, ...]] = ("terminal", "read_file", "write_file", "search")
    harness: ClassVar[str | HarnessSpec | None] = None
    """An agent harness this env's rollouts run instead of our loop (`core.harness`: a name or a spec), unless
    the batch names one; None: our loop."""

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    @abstractmethod
    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        """Items `offset .. offset+count`, cycling through the task set when it is shorter.

        Called one page at a time (a batch never asks for all of its items at once), so
        `count` is small; an env must not build more than `count` items to answer."""

    def image(self, item: Item) -> ImageSpec | None:
        """The image the item's slots run in (a build context or a reference), or None for the sandbox
        server's own root. Called on the worker when the item is loaded; by default the item's own
        `image`, else its data's `"image"` (`{"context": "/abs/folder"}` or `{"reference": "name:tag"}`,
        with `dockerfile`, `name`, `build_timeout_s` as `ImageSpec` has them)."""
        if item.image is not None:
            return item.image
        named = item.data.get("image")
        if named is None:
            return None
        try:
            return ImageSpec.model_validate(named)
        except ValueError as err:
            raise BadItem(f"item {item.id!r} of {self.name} names a bad image: {err}") from None

    def timeouts(self, item: Item) -> ItemTimeouts | None:
        """The item's own agent and verifier timeouts (narrower than the batch's), or None; called on the
        worker when the item is loaded. By default the item's own."""
        return item.timeouts

    def slot_network(self, item: Item) -> bool:
        """Whether the item's slot gets network (the server must allow it too); by default `allow_network`."""
        return self.allow_network

    def slot_limits(self, item: Item) -> dict[str, float]:
        """The item's slot limits, narrower than the server's (`sandbox_limits` names); by default the env's."""
        return dict(self.sandbox_limits)

    def item_count(self) -> int | None:
        """How many distinct items the env has; None when there is no end (generated items).
        A batch's `item_offset` must be below it."""
        return None

    def system_prompt(self) -> str | None:
        return None

    @abstractmethod
    def format_prompt(self, item: Item) -> str:
        """The user message that states the task."""

    def prompt_messages(self, item: Item) -> list[Message]:
        messages = []
        if system := self.config.get("system_prompt") or self.system_prompt():
            messages.append(Message(role="system", content=system))
        messages.append(Message(role="user", content=self.format_prompt(item)))
        return messages

    async def setup_workspace(self, item: Item, slot: SlotHandle) -> dict[str, Any]:
        """Prepare the slot's workspace for the item; returns small metadata for verify."""
        return {}

    @abstractmethod
    async def verify(self, item: Item, slot: SlotHandle, transcript: list[Message]) -> Verdict:
        """Score the rollout by checking the slot (run graders in the sandbox, not the worker)."""

    def reference_solution(self, item: Item) -> list[list[ScriptedCall]] | None:
        """Turns of tool calls that solve the item, for the demo policy; None if unknown."""
        return None

    def tool_specs(self) -> list[ToolSpec]:
        from temporal_rollouts.tools.catalogue import tool_specs

        return tool_specs(self.config.get("tools") or self.tool_names)


def as_loaded(env: Env, items: list[Item]) -> list[Item]:
    """The items with the image each runs in and its own timeouts, as `env.image` and `env.timeouts` name
    them, set on the item itself: the workflow sees them (and builds the image first) without env code."""
    loaded = []
    for item in items:
        image, timeouts = env.image(item), env.timeouts(item)
        if (image, timeouts) != (item.image, item.timeouts):
            item = item.model_copy(update={"image": image, "timeouts": timeouts})
        loaded.append(item)
    return loaded
