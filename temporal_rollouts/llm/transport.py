"""The HTTP side every model client shares: one pooled client with retries off, and one
request helper that turns any failure into our typed model errors (`llm.http_status`).

The client speaks httpx (tests hand it an `httpx.MockTransport`), but its default transport is
aiohttp: httpx's own pool cost 1.5-3 CPU-ms a request with hundreds in flight (it checks every
open connection on every request), aiohttp's about a third of that through this adapter."""

from __future__ import annotations

from typing import Any

import aiohttp
import httpx

from temporal_rollouts.llm.http_status import error_for_exception, raise_for_status
from temporal_rollouts.core.http_session import new_session, proxy_for

KEEP_ALIVE_S = 4.0
"""How long an idle connection to a model server is kept: shorter than uvicorn's default of 5 s,
which vLLM and SGLang serve with, so the client never reuses a connection the server is closing."""


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
        transport = AiohttpTransport(max_connections)
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


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport that sends through one aiohttp session, made on first use in the loop that
    uses it. It reads each answer whole (model replies are small JSON) and raises httpx's own
    exceptions, so `error_for_exception` classifies failures the same whichever transport sent."""

    def __init__(self, max_connections: int | None = None) -> None:
        self._max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._session is None:
            self._session = new_session(
                keep_alive_s=KEEP_ALIVE_S, max_connections=self._max_connections, auto_decompress=False
            )
        timeouts = request.extensions.get("timeout", {})
        timeout = aiohttp.ClientTimeout(
            total=None,
            connect=timeouts.get("pool"),
            sock_connect=timeouts.get("connect"),
            sock_read=timeouts.get("read"),
        )
        try:
            async with self._session.request(
                request.method,
                str(request.url),
                headers=request.headers.multi_items(),
                data=await request.aread() or None,
                allow_redirects=False,
                timeout=timeout,
                proxy=proxy_for(request.url.scheme, request.url.host),
            ) as answer:
                status, headers, body = answer.status, answer.raw_headers, await answer.read()
        except aiohttp.ConnectionTimeoutError as err:
            raise httpx.ConnectTimeout(str(err) or "connect timed out", request=request) from err
        except TimeoutError as err:
            raise httpx.ReadTimeout(str(err) or "read timed out", request=request) from err
        except aiohttp.ClientConnectorError as err:
            raise httpx.ConnectError(str(err), request=request) from err
        except (aiohttp.InvalidURL, aiohttp.NonHttpUrlClientError) as err:
            raise httpx.UnsupportedProtocol(str(err), request=request) from err
        except (aiohttp.ClientError, OSError) as err:  # reset, closed keep-alive connection, truncated body
            raise httpx.ReadError(str(err) or type(err).__name__, request=request) from err
        return httpx.Response(status, headers=list(headers), content=body, request=request)

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
