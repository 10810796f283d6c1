"""The slot as env hooks see it: each operation keyed, so a retried hook replays stored results."""

from __future__ import annotations

from sandboxes.pool import SandboxPool
from sandboxes.schema import ExecOp, ReadFileOp, SlotRef, ToolOutput, WriteFileOp


class LeasedSlot:
    def __init__(self, pool: SandboxPool, lease: SlotRef, key_prefix: str) -> None:
        self._pool = pool
        self._lease = lease
        self._prefix = key_prefix

    def _call_id(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    async def exec(self, key: str, command: str, timeout_s: float = 60.0) -> ToolOutput:
        return await self._pool.execute(self._lease, self._call_id(key), ExecOp(command=command, timeout_s=timeout_s))

    async def write_file(self, key: str, path: str, content: str) -> ToolOutput:
        return await self._pool.execute(self._lease, self._call_id(key), WriteFileOp(path=path, content=content))

    async def read_file(self, key: str, path: str) -> ToolOutput:
        return await self._pool.execute(self._lease, self._call_id(key), ReadFileOp(path=path))
