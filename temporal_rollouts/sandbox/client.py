"""HTTP client of one sandbox server: sends any request of `sandbox.requests` and parses its reply.

Error bodies are raised again as their own `RolloutError` type, and a server
that cannot be reached becomes `SandboxUnreachable`, which is retryable. Every
request has a timeout (its route says how long the server may take beyond it:
an acquire's wait, an operation's own timeout), so a hung server surfaces as
`SandboxUnreachable` instead of a hung rollout. Files travel as streams, one
chunk in memory at a time.

It speaks aiohttp, not httpx: a rollout step sends one or two requests here, and with
hundreds of rollouts in flight httpx spent 1.5-3 CPU-ms on each (its pool checks every
open connection on every request) where aiohttp spends about 0.25 (bench/README.md).
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

import aiohttp
from pydantic import BaseModel, ValidationError

from temporal_rollouts.core.errors import (
    SandboxError,
    SandboxUnreachable,
    TransferTooLarge,
    raise_from_payload,
)
from temporal_rollouts.core.http_session import new_session, proxy_of
from temporal_rollouts.core.inputs import field_default
from temporal_rollouts.core.settings import PoolOptions
from temporal_rollouts.sandbox.requests import DOWNLOAD, UPLOADS, Route, route_of
from temporal_rollouts.sandbox_server.schema import TransferQuery

TRANSFER_CHUNK_BYTES = 1024 * 1024
TRANSFER_TIMEOUT_S = 600.0
"""A transfer's read and write timeouts apply per chunk; this bounds the wait for its answer."""

KEEP_ALIVE_S = 15.0
"""How long an idle connection is kept: shorter than the sandbox server's keep-alive (30 s)."""

TRANSPORT_ERRORS = (aiohttp.ClientError,)
"""What a request raises when the server cannot be reached or breaks off: connection refused or reset,
a closed keep-alive connection, a truncated body, a malformed URL (aiohttp wraps the socket's own
OSErrors in these). A local file that cannot be read or written raises its OSError unchanged."""


class SandboxClient:
    base_url: str
    timeout: float

    def __init__(
        self, base_url: str, token: str, timeout: float = field_default(PoolOptions, "request_timeout_s")
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}"}
        self._session: aiohttp.ClientSession | None = None
        self._proxy = proxy_of(self.base_url)

    @property
    def _http(self) -> aiohttp.ClientSession:
        # Made on first use, inside the event loop that will use it (aiohttp binds a session to one).
        if self._session is None:
            # No cap on connections: every waiting acquire holds one for its whole wait, and a cap
            # would queue the executes and releases of running rollouts behind them.
            self._session = new_session(keep_alive_s=KEEP_ALIVE_S, base_url=self.base_url + "/", headers=self._headers)
        return self._session

    async def __aenter__(self) -> SandboxClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()

    def _options(self, read_s: float) -> dict[str, Any]:
        """Per request: how long it may take (to connect, then between reads), and through which proxy."""
        return {"timeout": aiohttp.ClientTimeout(sock_connect=self.timeout, sock_read=read_s), "proxy": self._proxy}

    async def send(self, request: BaseModel) -> Any:
        """Send one request of `sandbox.requests.ROUTES`; its reply, as the route's model."""
        route = route_of(request)
        what = f"{route.method} {route.path}"
        params = data = headers = None
        if route.method == "GET":
            params = _query(request.model_dump(mode="json"))
        else:
            data, headers = request.model_dump_json(), {"Content-Type": "application/json"}
        try:
            async with self._http.request(
                route.method,
                route.path.lstrip("/"),
                params=params,
                data=data,
                headers=headers,
                **self._options(self.timeout + route.runs_for(request)),
            ) as response:
                status, body = response.status, await response.read()
        except TimeoutError as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not answer {what} in time: {err!r}") from err
        except TRANSPORT_ERRORS as err:
            raise SandboxUnreachable(f"cannot reach sandbox {self.base_url}: {err!r}") from err
        return _parse(route, _payload_or_raise(status, body, what, self.base_url))

    async def upload(self, query: BaseModel, source: Path) -> Any:
        """Stream a local file into the server: into a slot (`TransferQuery`: a file's bytes, or a folder
        packed as a tar) or into the container's shared cache (`CacheQuery`: a tar.gz). A retry re-reads it."""
        route = route_of(query, UPLOADS)
        what = f"{route.method} {route.path}"
        try:
            async with self._http.put(
                route.path.lstrip("/"),
                params=_query(query.model_dump(mode="json")),
                data=_file_chunks(source),
                **self._options(self.timeout + TRANSFER_TIMEOUT_S),
            ) as response:
                status, body = response.status, await response.read()
        except TimeoutError as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not take {what} in time: {err!r}") from err
        except TRANSPORT_ERRORS as err:
            raise SandboxUnreachable(f"{what} to sandbox {self.base_url} failed: {err!r}") from err
        return _parse(route, _payload_or_raise(status, body, what, self.base_url))

    async def download(self, query: TransferQuery, destination: Path) -> tuple[int, str]:
        """Stream a slot's file (or a folder as a tar) into a local file; (bytes, "file" or "dir")."""
        params = query.model_dump(mode="json", include={"slot", "lease_id", "path", "format", "max_bytes", "whole"})
        what = f"{DOWNLOAD.method} {DOWNLOAD.path}"
        try:
            async with self._http.request(
                DOWNLOAD.method,
                DOWNLOAD.path.lstrip("/"),
                params=_query(params),
                **self._options(self.timeout + TRANSFER_TIMEOUT_S),
            ) as response:
                if not 200 <= response.status < 300:
                    _payload_or_raise(response.status, await response.read(), what, self.base_url)
                written = 0
                with open(destination, "wb") as out:
                    async for chunk in response.content.iter_chunked(TRANSFER_CHUNK_BYTES):
                        written += len(chunk)
                        if written > query.max_bytes:
                            raise TransferTooLarge(f"the download of {query.path!r} passed {query.max_bytes} bytes")
                        await asyncio.to_thread(out.write, chunk)
                return written, response.headers.get("x-transfer-kind", "file")
        except TimeoutError as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not send the download in time: {err!r}") from err
        except TRANSPORT_ERRORS as err:
            raise SandboxUnreachable(f"download from sandbox {self.base_url} failed: {err!r}") from err


def _query(params: Mapping[str, Any]) -> dict[str, str]:
    """Query parameters as the server's models read them back (`true`/`false`, numbers as text); an
    unset field is left out, so the server applies its own default."""
    return {
        name: ("true" if value else "false") if isinstance(value, bool) else str(value)
        for name, value in params.items()
        if value is not None
    }


def _payload_or_raise(status: int, body: bytes, what: str, base_url: str) -> Any:
    try:
        payload = json.loads(body)
    except ValueError:
        payload = None
    if 200 <= status < 300 and payload is not None:
        return payload
    raise_from_payload(payload, fallback=SandboxError)
    message = f"sandbox {base_url} answered {what} with HTTP {status}"
    if status >= 500:
        raise SandboxUnreachable(message)
    raise SandboxError(message)


async def _file_chunks(source: Path) -> AsyncIterator[bytes]:
    fd = os.open(source, os.O_RDONLY)
    try:
        while chunk := await asyncio.to_thread(os.read, fd, TRANSFER_CHUNK_BYTES):
            yield chunk
    finally:
        os.close(fd)


def _parse(route: Route, payload: Any) -> Any:
    try:
        return route.reply.validate_python(payload)
    except ValidationError as err:
        raise SandboxError(f"malformed sandbox reply: {err}") from err
