"""The slot as env hooks see it: each operation keyed, so a retried hook replays stored results.

Verify also finds here what the env's setup returned (`meta`).
"""

from __future__ import annotations

from typing import Any

from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_COMMAND_TIMEOUT_S,
    ExecOp,
    ReadFileOp,
    SlotRef,
    ToolOutput,
    WriteFileOp,
)


class LeasedSlot:
    def __init__(self, pool: SandboxPool, lease: SlotRef, key_prefix: str, *, meta: dict[str, Any] | None = None) -> None:
        self._pool = pool
        self.meta = dict(meta or {})
        self._lease = lease
        self._prefix = key_prefix

    def _call_id(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    async def exec(self, key: str, command: str, timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S) -> ToolOutput:
        return await self._pool.execute(self._lease, self._call_id(key), ExecOp(command=command, timeout_s=timeout_s))

    async def write_file(self, key: str, path: str, content: str) -> ToolOutput:
        return await self._pool.execute(self._lease, self._call_id(key), WriteFileOp(path=path, content=content))

    async def read_file(self, key: str, path: str) -> ToolOutput:
        return await self._pool.execute(self._lease, self._call_id(key), ReadFileOp(path=path))
