"""The slot as env hooks see it: the verifier handle, like the original's ToolContext.

Setup and verify get one `LeasedSlot`: a one-shot `terminal` (`read_only=True` for a check
that must see the workspace as the agent left it), the stateful terminal (`terminal_stateful`,
`send_keys`, `screen`, `terminal_output`, `stop_terminal`), `stop_processes` (every process of
the slot, before a check), `read_file`, `write_file` and `search`, all in the rollout's own slot and keyed as
below, plus `meta`, what setup returned (empty during setup). It is a `Lease`
(`sandbox.lease`), so `upload`, `download`, `list_files` and `share` (the container's
read-only cache, shared by its slots) are the worker's own, declared there once.
Env authors write `await slot.terminal("pytest -q")`, never HTTP.

Keys. Every operation that changes or runs something has a call id, and the sandbox
answers a repeated id from its stored result, so a retried hook does not run its
commands twice. A caller may name the key (`key="check"`, or the older positional
form `exec(key, command)`); otherwise it is `auto-<n>-<op>-<digest>`: `n` counts the
calls of this hook in the order they are made, and the digest covers the operation
itself. A retried hook is a fresh handle whose counter starts again at 0, and a hook is
code that makes the same calls in the same order when it gets the same answers, which a
retry does (the answers are the stored ones). Calls started together with
`asyncio.gather` are numbered in the order gather starts them, which is fixed. If a
retry does make a different call at some position (the hook's code changed between
attempts, or it branches on the clock), the digest differs, so that call runs anew
instead of being answered with another call's result. Transfers and listings carry no
key: an upload writes the same bytes again and a download only reads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from temporal_rollouts.sandbox.lease import Lease
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_COMMAND_TIMEOUT_S,
    DEFAULT_SESSION_TIMEOUT_S,
    ExecOp,
    Operation,
    ReadFileOp,
    SearchOp,
    SessionOp,
    SlotRef,
    StopProcessesOp,
    ToolOutput,
    VerifierMounts,
    WriteFileOp,
)

VERIFY_TIMEOUT_S = 180.0
"""The one-shot terminal's default timeout here, as in the original's ToolContext."""


class LeasedSlot(Lease):
    meta: dict[str, Any]
    """What setup returned, in verify (empty during setup)."""

    def __init__(
        self,
        pool: SandboxPool,
        lease: SlotRef,
        key_prefix: str,
        *,
        meta: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(pool.fleet, lease)
        self.meta = dict(meta or {})
        self._prefix = key_prefix
        self._calls = 0

    # one-shot commands and files ------------------------------------------------------------

    async def terminal(
        self,
        command: str,
        timeout: float = VERIFY_TIMEOUT_S,
        *,
        key: str | None = None,
        cache: Sequence[str] = (),
        read_only: bool = False,
    ) -> ToolOutput:
        """Run `command` with bash in a fresh sandboxed shell in /workspace; output and exit code.
        `cache`: entries of the container's shared cache (see `share`) this command alone sees,
        read-only, at /cache/<name>. `read_only`: the workspace is mounted read-only for it, so no
        program it runs (the agent's, under test) can change what it checks."""
        return await self._run(key, ExecOp(command=command, timeout_s=timeout, cache=list(cache), read_only=read_only))

    async def exec(
        self,
        key: str,
        command: str,
        timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S,
        *,
        cache: Sequence[str] = (),
        read_only: bool = False,
    ) -> ToolOutput:
        """`terminal` with its key first (the older form)."""
        return await self._run(
            key, ExecOp(command=command, timeout_s=timeout_s, cache=list(cache), read_only=read_only)
        )

    async def verifier(
        self, command: str, mounts: VerifierMounts, *, timeout: float = VERIFY_TIMEOUT_S, key: str | None = None
    ) -> ToolOutput:
        """Run `command` as a verifier (`VerifierMounts`): with the tests (a `share`d entry) read-only at their
        place, a fresh output folder whose files the server reads back into `collected`, and on an item image,
        with `pristine`, the image as built instead of the root the agent changed. Call `stop_processes` first."""
        return await self._run(key, ExecOp(command=command, timeout_s=timeout, verifier=mounts))

    async def read_file(self, *args: str, key: str | None = None) -> ToolOutput:
        """`read_file(path)`, or the older `read_file(key, path)`."""
        key, (path,) = _split_key(args, 1, key, "read_file(path)")
        return await self._run(key, ReadFileOp(path=path))

    async def write_file(self, *args: str, key: str | None = None) -> ToolOutput:
        """`write_file(path, content)`, or the older `write_file(key, path, content)`."""
        key, (path, content) = _split_key(args, 2, key, "write_file(path, content)")
        return await self._run(key, WriteFileOp(path=path, content=content))

    async def search(
        self, pattern: str, path: str = ".", *, max_matches: int = 200, key: str | None = None
    ) -> ToolOutput:
        """Lines matching a Perl regular expression under `path`, with file and line number."""
        return await self._run(key, SearchOp(pattern=pattern, path=path, max_matches=max_matches))

    # the stateful terminal ------------------------------------------------------------------

    async def terminal_stateful(
        self, command: str, timeout: float = DEFAULT_SESSION_TIMEOUT_S, *, key: str | None = None
    ) -> ToolOutput:
        """Run `command` in the slot's long-lived shell (the agent's, if it used one): directory,
        variables and background processes carry over. Starts the shell if none runs."""
        return await self._run(key, SessionOp(action="run", text=command, timeout_s=timeout))

    async def send_keys(self, keys: str, wait: float = 1.0, *, key: str | None = None) -> ToolOutput:
        """Type `keys` into the stateful terminal; answers what it printed within `wait` seconds."""
        return await self._run(key, SessionOp(action="send_keys", text=keys, timeout_s=wait))

    async def screen(self, *, key: str | None = None) -> ToolOutput:
        """The stateful terminal's last lines, as a person would see them."""
        return await self._run(key, SessionOp(action="screen"))

    async def terminal_output(self, *, key: str | None = None) -> ToolOutput:
        """What the stateful terminal printed since the last read (a `terminal_stateful` reads its own)."""
        return await self._run(key, SessionOp(action="read"))

    async def stop_terminal(self, *, key: str | None = None) -> ToolOutput:
        """End the stateful terminal and everything it started."""
        return await self._run(key, SessionOp(action="stop"))

    async def stop_processes(self, *, key: str | None = None) -> ToolOutput:
        """End every process of the slot: the stateful terminal, the agent's resident launcher, what is
        left in the slot's cgroups and every process of its uid. A verifier calls it before it checks."""
        return await self._run(key, StopProcessesOp())

    # keys -----------------------------------------------------------------------------------

    async def _run(self, key: str | None, operation: Operation) -> ToolOutput:
        position = self._calls
        self._calls += 1
        if key is None:
            digest = hashlib.sha256(operation.model_dump_json().encode()).hexdigest()[:12]
            key = f"auto-{position}-{operation.op}-{digest}"
        return await self.execute(f"{self._prefix}/{key}", operation)


def _split_key(args: tuple[str, ...], arity: int, key: str | None, usage: str) -> tuple[str | None, tuple[str, ...]]:
    if len(args) == arity + 1 and key is None:
        return args[0], args[1:]
    if len(args) == arity:
        return key, args
    raise TypeError(f"call {usage}, optionally with key=...; got {len(args)} positional arguments")
