"""HTTP client of one sandbox server: sends any request of `sandbox.requests` and parses its reply.

Error bodies are raised again as their own `RolloutError` type, and a server
that cannot be reached becomes `SandboxUnreachable`, which is retryable. Every
request has a timeout (its route says how long the server may take beyond it:
an acquire's wait, an operation's own timeout), so a hung server surfaces as
`SandboxUnreachable` instead of a hung rollout. Files travel as streams, one
chunk in memory at a time.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from temporal_rollouts.core.errors import (
    SandboxError,
    SandboxUnreachable,
    TransferTooLarge,
    raise_from_payload,
)
from temporal_rollouts.sandbox.requests import DOWNLOAD, UPLOADS, Route, route_of
from temporal_rollouts.sandbox_server.schema import TransferQuery

TRANSFER_CHUNK_BYTES = 1024 * 1024
TRANSFER_TIMEOUT_S = 600.0
"""A transfer's read and write timeouts apply per chunk; this bounds the wait for its answer."""


class SandboxClient:
    base_url: str
    timeout: float

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

    async def send(self, request: BaseModel) -> Any:
        """Send one request of `sandbox.requests.ROUTES`; its reply, as the route's model."""
        route = route_of(request)
        what = f"{route.method} {route.path}"
        content = params = headers = None
        if route.method == "GET":
            params = request.model_dump(mode="json")
        else:
            content, headers = request.model_dump_json(), {"Content-Type": "application/json"}
        try:
            response = await self._http.request(
                route.method,
                route.path,
                params=params,
                content=content,
                headers=headers,
                timeout=self.timeout + route.runs_for(request),
            )
        except httpx.TimeoutException as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not answer {what} in time: {err!r}") from err
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"cannot reach sandbox {self.base_url}: {err!r}") from err
        return _parse(route, _payload_or_raise(response, what, self.base_url))

    async def upload(self, query: BaseModel, source: Path) -> Any:
        """Stream a local file into the server: into a slot (`TransferQuery`: a file's bytes, or a folder
        packed as a tar) or into the container's shared cache (`CacheQuery`: a tar.gz). A retry re-reads it."""
        route = route_of(query, UPLOADS)
        what = f"{route.method} {route.path}"
        try:
            response = await self._http.put(
                route.path,
                params=query.model_dump(mode="json"),
                content=_file_chunks(source),
                timeout=self._transfer_timeout(),
            )
        except httpx.TimeoutException as err:
            raise SandboxUnreachable(f"sandbox {self.base_url} did not take {what} in time: {err!r}") from err
        except httpx.TransportError as err:
            raise SandboxUnreachable(f"{what} to sandbox {self.base_url} failed: {err!r}") from err
        return _parse(route, _payload_or_raise(response, what, self.base_url))

    async def download(self, query: TransferQuery, destination: Path) -> tuple[int, str]:
        """Stream a slot's file (or a folder as a tar) into a local file; (bytes, "file" or "dir")."""
        params = query.model_dump(mode="json", include={"slot", "lease_id", "path", "format", "max_bytes"})
        what = f"{DOWNLOAD.method} {DOWNLOAD.path}"
        try:
            async with self._http.stream(
                DOWNLOAD.method, DOWNLOAD.path, params=params, timeout=self._transfer_timeout()
            ) as response:
                if not response.is_success:
                    await response.aread()
                    _payload_or_raise(response, what, self.base_url)
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

    def _transfer_timeout(self) -> httpx.Timeout:
        return httpx.Timeout(self.timeout + TRANSFER_TIMEOUT_S, connect=self.timeout)


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


def _parse(route: Route, payload: Any) -> Any:
    try:
        return route.reply.validate_python(payload)
    except ValidationError as err:
        raise SandboxError(f"malformed sandbox reply: {err}") from err
