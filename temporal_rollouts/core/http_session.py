"""The aiohttp session our hot-path clients share: one per client, made inside its event loop.

Proxies still come from the environment (HTTP_PROXY, HTTPS_PROXY, NO_PROXY), as they did
with httpx, but are looked up once per host rather than on every request: aiohttp's own
`trust_env` re-reads the variables and parses ~/.netrc for each request.
"""

from __future__ import annotations

import ssl
import urllib.request
from functools import cache

import aiohttp
import certifi
from yarl import URL


def new_session(
    *, keep_alive_s: float, max_connections: int | None = None, **session_options: object
) -> aiohttp.ClientSession:
    """A pooled session; `max_connections` None means no cap. An idle connection is dropped after
    `keep_alive_s`, which must be shorter than the server's own keep-alive: a client that reuses a
    connection the server is closing gets an error for a request that was never read. Certificates
    are checked against certifi's bundle, as httpx did."""
    connector = aiohttp.TCPConnector(limit=max_connections or 0, keepalive_timeout=keep_alive_s, ssl=_ssl_context())
    return aiohttp.ClientSession(connector=connector, **session_options)  # type: ignore[arg-type]


@cache
def _ssl_context() -> ssl.SSLContext:
    return ssl.create_default_context(cafile=certifi.where())


@cache
def proxy_for(scheme: str, host: str) -> str | None:
    """The proxy the environment names for `scheme://host`, or None (no proxy, or NO_PROXY covers it)."""
    if urllib.request.proxy_bypass_environment(host):
        return None
    return urllib.request.getproxies_environment().get(scheme)


def proxy_of(url: URL | str) -> str | None:
    url = URL(url)
    return proxy_for(url.scheme, url.host or "")
