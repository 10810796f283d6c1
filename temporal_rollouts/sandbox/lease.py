"""Work in one leased slot: every operation a lease allows, declared once, sent through the fleet.

The pool hands out and takes back leases (`SandboxPool.acquire`, `release`); what is done
under a lease is here: renew it, narrow its limits, execute an operation, move files in and
out, snapshot and restore the workspace, or take another slot's workspace in the same container. Each method builds the server's request model from
the lease and its own arguments, and the fleet carries it to the lease's container (restarting
it in place if it died). The env's handle (`sandbox.handle.LeasedSlot`) is a Lease too.

Files travel through temporary files on the worker: a folder is packed into a tar before an
upload, and a download is spooled before it is unpacked or moved into place, so memory holds
one chunk at a time and a request retried after a restart streams the same file again.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from temporal_rollouts.sandbox import transfer
from temporal_rollouts.sandbox.fleet import Fleet
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_ARCHIVE_BYTES,
    CacheEntry,
    CacheQuery,
    CopyRequest,
    ExecuteRequest,
    FileListing,
    HarnessAnswered,
    HarnessAnswerRequest,
    HarnessNext,
    HarnessNextRequest,
    HarnessStartRequest,
    HarnessStopRequest,
    HarnessState,
    ListQuery,
    NarrowRequest,
    Operation,
    RenewRequest,
    SlotLease,
    SlotLimitsRequest,
    SlotRef,
    ToolOutput,
    TransferFormat,
    TransferQuery,
    TransferResult,
)


class Lease:
    def __init__(self, fleet: Fleet, ref: SlotRef, *, max_transfer_bytes: int | None = None) -> None:
        self._fleet = fleet
        self._ref = ref
        self._max_transfer_bytes = max_transfer_bytes or fleet.backend.sandbox.max_transfer_bytes
        """Asked for on every transfer: the cap the servers are started with (`sandbox.max_transfer_bytes`)
        unless this lease was given a lower one."""

    async def renew(self, ttl_s: float = DEFAULT_LEASE_TTL_S) -> SlotLease:
        return await self._send(RenewRequest(**self._held(), ttl_s=ttl_s))

    async def narrow(self, limits: SlotLimitsRequest) -> SlotLimitsRequest:
        """Lower this lease's limits (an env's own); the limits now in force."""
        return await self._send(NarrowRequest(**self._held(), limits=limits))

    async def execute(self, call_id: str, operation: Operation) -> ToolOutput:
        """Run one operation; a repeated `call_id` is answered from the stored result instead."""
        return await self._send(ExecuteRequest(**self._held(), call_id=call_id, operation=operation))

    async def upload(self, local: str | Path, remote: str) -> TransferResult:
        """Copy a local file or folder into the slot at `remote` (a folder is merged into it)."""
        local = Path(local)
        if not local.exists():
            raise FileNotFoundError(f"nothing to upload at {local}")
        if not local.is_dir():
            return await self._upload(local, remote, "file", self._max_transfer_bytes)
        with transfer.temp_path(suffix=".tar") as packed:
            await asyncio.to_thread(transfer.pack_folder, local, packed)
            return await self._upload(packed, remote, "tar", self._max_transfer_bytes)

    async def download(self, remote: str, local: str | Path) -> TransferResult:
        """Copy a file or folder of the slot to `local` on the worker (a folder is merged into it)."""
        local = Path(local)
        query = TransferQuery(**self._held(), path=remote, format="tar", max_bytes=self._max_transfer_bytes)
        with transfer.temp_path(near=local) as spool:
            size, kind = await self._fleet.call(self._ref.container_id, lambda c: c.download(query, spool))
            if kind == "dir":
                entries = await asyncio.to_thread(transfer.unpack_folder, spool, local)
            else:
                await asyncio.to_thread(transfer.move_into_place, spool, local)
                entries = 1
        return TransferResult(path=str(local), bytes=size, entries=entries)

    async def list_files(self, path: str = ".", max_entries: int = 1000) -> FileListing:
        """The files under a folder of the slot (its artifacts), links not followed."""
        return await self._send(ListQuery(**self._held(), path=path, max_entries=max_entries))

    async def share(self, name: str, archive: str | Path) -> CacheEntry:
        """Put a local tar.gz into the shared, read-only cache of the slot's container as entry `name`,
        unless it is there (then nothing travels); concurrent puts of one name are serialised by the
        server. Commands name the entries they need (`ExecOp.cache`, a hook's `terminal(..., cache=[name])`);
        let `name` name the content (a digest), as the first put of a name wins. Entries outlive the lease."""
        query = CacheQuery(name=name, max_bytes=self._max_transfer_bytes)
        found = await self._send(query)
        if found.present:
            return found
        return await self._fleet.call(self._ref.container_id, lambda c: c.upload(query, Path(archive)))

    async def start_harness(self, harness_id: str, **fields: Any) -> HarnessState:
        """Run a harness as the slot's agent (`HarnessStartRequest`: `fields` are its other fields); a start of
        a `harness_id` the slot already has answers its state and starts nothing."""
        return await self._send(HarnessStartRequest(**self._held(), harness_id=harness_id, **fields))

    async def next_harness_request(self, harness_id: str, wait_s: float) -> HarnessNext:
        """The harness's oldest unanswered model request, its exit once it has ended, or neither within `wait_s`."""
        return await self._send(HarnessNextRequest(**self._held(), harness_id=harness_id, wait_s=wait_s))

    async def answer_harness_request(
        self, harness_id: str, request_id: str, body: dict[str, Any], status: int = 200
    ) -> HarnessAnswered:
        request = HarnessAnswerRequest(
            **self._held(), harness_id=harness_id, request_id=request_id, status=status, body=body
        )
        return await self._send(request)

    async def stop_harness(self, harness_id: str) -> HarnessState:
        """End the harness and everything it started; its state with how it ended."""
        return await self._send(HarnessStopRequest(**self._held(), harness_id=harness_id))

    async def archive_to(self, destination: Path, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> int:
        """Stream the slot's whole state, as a gzipped tar, into a local file; its size. The state is its
        workspace, or on an item image its writable layer (`TransferQuery.whole`)."""
        query = TransferQuery(**self._held(), path=".", format="tar.gz", max_bytes=max_bytes, whole=True)
        size, _ = await self._fleet.call(self._ref.container_id, lambda c: c.download(query, destination))
        return size

    async def restore_from(self, archive: Path, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> TransferResult:
        """Replace the slot's whole state with a gzipped tar written by `archive_to`, streamed."""
        return await self._upload(archive, ".", "tar.gz", max_bytes, replace=True, whole=True)

    async def copy_from(self, source: SlotRef, max_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES) -> TransferResult:
        """Replace this slot's workspace with `source`'s, a slot of the same container the caller also holds;
        the server copies it in place (nothing travels)."""
        if source.container_id != self._ref.container_id:
            raise ValueError(f"slot {source.slot} of {source.container_id} is in another container than this lease")
        return await self._send(
            CopyRequest(**self._held(), source_slot=source.slot, source_lease_id=source.lease_id, max_bytes=max_bytes)
        )

    async def _upload(
        self,
        source: Path,
        remote: str,
        format: TransferFormat,
        max_bytes: int,
        replace: bool = False,
        whole: bool = False,
    ) -> TransferResult:
        query = TransferQuery(
            **self._held(), path=remote, format=format, max_bytes=max_bytes, replace=replace, whole=whole
        )
        return await self._fleet.call(self._ref.container_id, lambda c: c.upload(query, source))

    async def _send(self, request: Any) -> Any:
        return await self._fleet.send(self._ref.container_id, request)

    def _held(self) -> dict[str, Any]:
        return {"slot": self._ref.slot, "lease_id": self._ref.lease_id}
