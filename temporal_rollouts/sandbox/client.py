"""HTTP client of one sandbox server, returning the shared schema models.

Error bodies are raised again as their own `RolloutError` type, and a server
that cannot be reached becomes `SandboxUnreachable`, which is retryable. Every
request has a timeout (an acquire's is its wait plus the client timeout), so a
hung server surfaces as `SandboxUnreachable` instead of a hung rollout.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, TypeVar

import httpx
from pydantic import BaseModel, TypeAdapter, ValidationError

from temporal_rollouts.core.errors import (
    SandboxError,
    SandboxUnreachable,
    TransferTooLarge,
    raise_from_payload,
)
from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_LEASE_TTL_S,
    AcquireRequest,
    CacheEntry,
    CacheQuery,
    DrainRequest,
    DrainResult,
    ExecOp,
    ExecuteRequest,
    FileListing,
    HealthStatus,
    Holder,
    ListQuery,
    NarrowRequest,
    Operation,
    ReleaseRequest,
    ReleaseResult,
    RenewRequest,
    SessionOp,
    SlotLease,
    SlotLimitsRequest,
    SlotState,
    ToolOutput,
    TransferQuery,
    TransferResult,
    WithdrawRequest,
    WithdrawResult,
)

Model = TypeVar("Model", bound=BaseModel)

OPERATION_MARGIN_S = 30.0
TRANSFER_CHUNK_BYTES = 1024 * 1024
TRANSFER_TIMEOUT_S = 600.0
"""A transfer's read and write timeouts apply per chunk; this bounds the wait for its answer."""
SLOT_STATES = TypeAdapter(list[SlotState])


class SandboxClient:
    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        # No cap on connections: every waiting acquire holds one for its whole wait, and a cap
        # would queue the executes and releases of running rollouts behind them.
        self._http = httpx.AsyncClient(
            base_url=self.base_url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=32),
        )

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def health(self) -> HealthStatus:
        return _parse(HealthStatus, await self._request("GET", "/health"))

    async def slots(self) -> list[SlotState]:
        return _parse(SLOT_STATES, await self._request("GET", "/slots"))

    async def acquire(
        self,
        holder: Holder,
        ttl_s: float = DEFAULT_LEASE_TTL_S,
        wait_s: float = 30.0,
        allow_network: bool = False,
        ticket: str | None = None,
    ) -> SlotLease:
        """Lease a slot; with a `ticket`, `withdraw(ticket)` can take the request out of line.

        Cancelling this call closes its connection, which also takes it out of line."""
        body = AcquireRequest(holder=holder, ttl_s=ttl_s, wait_s=wait_s, allow_network=allow_network, ticket=ticket)
        reply = await self._request("POST", "/slots/acquire", body, timeout=self.timeout + wait_s)
        return _parse(SlotLease, reply)

    async def withdraw(self, ticket: str) -> WithdrawResult:
        """Take a waiting acquire out of line; its call then fails with SlotUnavailable. withdrawn=False
        when it was not waiting: then its call answers (or already answered) on its own."""
        return _parse(WithdrawResult, await self._request("POST", "/slots/withdraw", WithdrawRequest(ticket=ticket)))

    async def drain(self, idle_s: float) -> DrainResult:
        """Ask the server to refuse new leases if it has been idle `idle_s`; the answer says whether it does."""
        return _parse(DrainResult, await self._request("POST", "/drain", DrainRequest(idle_s=idle_s)))

    async def renew(self, slot: int, lease_id: str, ttl_s: float = DEFAULT_LEASE_TTL_S) -> SlotLease:
        body = RenewRequest(slot=slot, lease_id=lease_id, ttl_s=ttl_s)
        return _parse(SlotLease, await self._request("POST", "/slots/renew", body))

    async def release(
        self, slot: int, lease_id: str, reset: bool = True, reason: Literal["released", "reaped"] = "released"
    ) -> ReleaseResult:
        body = ReleaseRequest(slot=slot, lease_id=lease_id, reset=reset, reason=reason)
        return _parse(ReleaseResult, await self._request("POST", "/slots/release", body))

    async def execute(self, slot: int, lease_id: str, call_id: str, operation: Operation) -> ToolOutput:
        body = ExecuteRequest(slot=slot, lease_id=lease_id, call_id=call_id, operation=operation)
        runs_for = operation.timeout_s if isinstance(operation, ExecOp | SessionOp) else 0.0
        timeout = self.timeout + OPERATION_MARGIN_S + runs_for
        return _parse(ToolOutput, await self._request("POST", "/execute", body, timeout=timeout))

    async def narrow(self, slot: int, lease_id: str, limits: SlotLimitsRequest) -> SlotLimitsRequest:
        """Lower this lease's limits; returns the limits now in force."""
        body = NarrowRequest(slot=slot, lease_id=lease_id, limits=limits)
        return _parse(SlotLimitsRequest, await self._request("POST", "/slots/limits", body))

    async def upload(self, query: TransferQuery, source: Path) -> TransferResult:
        """Stream a local file (a file's bytes, or a folder packed as a tar) into the slot; a retry re-reads it."""
        params = query.model_dump(mode="json")
        try:
            response = await self._http.put(
                "/files", params=params, content=_file_chunks(source), timeout=self._transfer_timeout()
            )
        except httpx.TimeoutException as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not take the upload in time: {err!r}") from err
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"upload to sandbox {self.base_url} failed: {err!r}") from err
        return _parse(TransferResult, _payload_or_raise(response, "PUT /files", self.base_url))

    async def download(self, query: TransferQuery, destination: Path) -> tuple[int, str]:
        """Stream a slot's file (or a folder as a tar) into a local file; (bytes, "file" or "dir")."""
        params = query.model_dump(mode="json", include={"slot", "lease_id", "path", "format", "max_bytes"})
        try:
            async with self._http.stream("GET", "/files", params=params, timeout=self._transfer_timeout()) as response:
                if not response.is_success:
                    await response.aread()
                    _payload_or_raise(response, "GET /files", self.base_url)
                written = 0
                with open(destination, "wb") as out:
                    async for chunk in response.aiter_raw(TRANSFER_CHUNK_BYTES):
                        written += len(chunk)
                        if written > query.max_bytes:
                            raise TransferTooLarge(f"the download of {query.path!r} passed {query.max_bytes} bytes")
                        await asyncio.to_thread(out.write, chunk)
                return written, response.headers.get("x-transfer-kind", "file")
        except httpx.TimeoutException as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not send the download in time: {err!r}") from err
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"download from sandbox {self.base_url} failed: {err!r}") from err

    async def cache_get(self, query: CacheQuery) -> CacheEntry:
        """Whether the container's shared cache holds an entry."""
        try:
            response = await self._http.get("/cache", params=query.model_dump(mode="json"))
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"cannot reach sandbox {self.base_url}: {err!r}") from err
        return _parse(CacheEntry, _payload_or_raise(response, "GET /cache", self.base_url))

    async def cache_put(self, query: CacheQuery, source: Path) -> CacheEntry:
        """Stream a local tar.gz into the container's shared cache as one entry (a no-op if it is there)."""
        try:
            response = await self._http.put(
                "/cache", params=query.model_dump(mode="json"), content=_file_chunks(source),
                timeout=self._transfer_timeout(),
            )
        except httpx.TimeoutException as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not take the cache entry in time: {err!r}") from err
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"cache put to sandbox {self.base_url} failed: {err!r}") from err
        return _parse(CacheEntry, _payload_or_raise(response, "PUT /cache", self.base_url))

    async def list_files(self, query: ListQuery) -> FileListing:
        params = query.model_dump(mode="json")
        try:
            response = await self._http.get("/files/list", params=params)
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"cannot reach sandbox {self.base_url}: {err!r}") from err
        return _parse(FileListing, _payload_or_raise(response, "GET /files/list", self.base_url))

    def _transfer_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout + TRANSFER_TIMEOUT_S, connect=self.timeout)

    async def _request(
        self, method: str, path: str, body: BaseModel | None = None, timeout: float | None = None
    ) -> Any:
        content = body.model_dump_json() if body is not None else None
        headers = {"Content-Type": "application/json"} if body is not None else None
        try:
            response = await self._http.request(
                method, path, content=content, headers=headers, timeout=timeout or httpx.USE_CLIENT_DEFAULT
            )
        except httpx.TimeoutException as err:
            raise SandboxUnreachable(
                f"sandbox {self.base_url} did not answer {method} {path} in time: {err!r}"
            ) from err
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"cannot reach sandbox {self.base_url}: {err!r}") from err
        return _payload_or_raise(response, f"{method} {path}", self.base_url)


def _payload_or_raise(response: httpx.Response, what: str, base_url: str) -> Any:
    try:
        payload = response.json()
    except ValueError:
        payload = None
    if response.is_success and payload is not None:
        return payload
    raise_from_payload(payload, fallback=SandboxError)
    message = f"sandbox {base_url} answered {what} with HTTP {response.status_code}"
    if response.status_code >= 500:
        raise SandboxUnreachable(message)
    raise SandboxError(message)


async def _file_chunks(source: Path) -> AsyncIterator[bytes]:
    fd = os.open(source, os.O_RDONLY)
    try:
        while chunk := await asyncio.to_thread(os.read, fd, TRANSFER_CHUNK_BYTES):
            yield chunk
    finally:
        os.close(fd)


def _parse(model: type[Model] | TypeAdapter[Any], payload: Any) -> Any:
    try:
        if isinstance(model, TypeAdapter):
            return model.validate_python(payload)
        return model.model_validate(payload)
    except ValidationError as err:
        raise SandboxError(f"malformed sandbox reply: {err}") from err
