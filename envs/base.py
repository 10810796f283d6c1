"""What a task family (an env) provides, and the handle its hooks use to touch a slot.

Env code runs only inside activities: the workflow sees items as plain data and
never imports an env.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

from temporal_rollouts.core.messages import Message, ToolSpec
from temporal_rollouts.core.tasks import Item, ScriptedCall, Verdict
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_COMMAND_TIMEOUT_S,
    CacheEntry,
    FileListing,
    ToolOutput,
    TransferResult,
)

__all__ = ["Env", "Item", "ScriptedCall", "SlotHandle", "Verdict"]


class SlotHandle(Protocol):
    """The slot an env hook may use, like the original's ToolContext (implemented by
    `temporal_rollouts.sandbox.handle.LeasedSlot`, whose docstring says how calls are keyed so
    that a retried hook is answered from the sandbox's stored results instead of running twice).
    In verify, `meta` holds what `setup_workspace` returned (empty during setup)."""

    meta: dict[str, Any]

    async def terminal(
        self, command: str, timeout: float = ..., *, key: str | None = None, cache: Sequence[str] = ()
    ) -> ToolOutput: ...

    async def exec(
        self, key: str, command: str, timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S, *, cache: Sequence[str] = ()
    ) -> ToolOutput: ...

    async def write_file(self, *args: str, key: str | None = None) -> ToolOutput: ...

    async def read_file(self, *args: str, key: str | None = None) -> ToolOutput: ...

    async def search(
        self, pattern: str, path: str = ".", *, max_matches: int = 200, key: str | None = None
    ) -> ToolOutput: ...

    async def terminal_stateful(self, command: str, timeout: float = ..., *, key: str | None = None) -> ToolOutput: ...

    async def send_keys(self, keys: str, wait: float = 1.0, *, key: str | None = None) -> ToolOutput: ...

    async def screen(self, *, key: str | None = None) -> ToolOutput: ...

    async def terminal_output(self, *, key: str | None = None) -> ToolOutput: ...

    async def stop_terminal(self, *, key: str | None = None) -> ToolOutput: ...

    async def upload(self, local: str | Path, remote: str) -> TransferResult: ...

    async def download(self, remote: str, local: str | Path) -> TransferResult: ...

    async def list_files(self, path: str = ".", max_entries: int = 1000) -> FileListing: ...

    async def share(self, name: str, archive: str | Path) -> CacheEntry: ...


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

    def __init__(self, config: dict[str, Any] | None = None) -> None:
        self.config = dict(config or {})

    @abstractmethod
    def load_items(self, count: int, offset: int = 0) -> list[Item]:
        """Items `offset .. offset+count`, cycling through the task set when it is shorter.

        Called one page at a time (a batch never asks for all of its items at once), so
        `count` is small; an env must not build more than `count` items to answer."""

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
