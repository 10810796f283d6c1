"""The HTTP side every model client shares: one pooled client with retries off, and one
request helper that turns any failure into our typed model errors (`llm.http_status`)."""

from __future__ import annotations

from typing import Any

import httpx

from temporal_rollouts.llm.http_status import error_for_exception, raise_for_status


def model_http_client(
    base_url: str,
    api_key: str | None,
    timeout_s: float,
    *,
    transport: httpx.AsyncBaseTransport | None = None,
    max_connections: int | None = 256,
) -> httpx.AsyncClient:
    """Temporal owns retries, so the transport never retries on its own."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    if transport is None:
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        transport = httpx.AsyncHTTPTransport(retries=0, limits=limits)
    return httpx.AsyncClient(base_url=base_url, headers=headers, timeout=httpx.Timeout(timeout_s), transport=transport)


async def post_json(
    http: httpx.AsyncClient, path: str, body: dict[str, Any], *, secrets: tuple[str, ...]
) -> httpx.Response:
    """One POST, sent once; a 2xx response or a raised `ModelError`."""
    try:
        response = await http.post(path, json=body)
    except (httpx.HTTPError, httpx.InvalidURL, OSError) as exc:
        leaks_secret = any(secret in str(exc) for secret in secrets)
        raise error_for_exception(exc, secrets=secrets) from (None if leaks_secret else exc)
    raise_for_status(response, secrets=secrets)
    return response
