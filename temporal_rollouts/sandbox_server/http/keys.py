"""The key every HTTP server of the project asks for, and when it must have one.

A server that listens only on a loopback address may run without a key: it is a person's own
machine, and the Host guard (`hosts`) keeps web pages out. A server that listens anywhere else
refuses to start without one (`require_key`): every machine that reaches the address could
otherwise drive it (load other weights into a policy, read every conversation, run the demo
policy's control routes). With a key, every route but the server's health check needs
`Authorization: Bearer KEY`, compared in constant time (`hmac.compare_digest`), so the time a
refusal takes says nothing about how much of a guess was right.

The key comes from an environment variable the command line names (`--api-key-env NAME`), which
the server reads once and removes from its environment, never from the command line itself:
every local process can read another's `/proc/<pid>/cmdline`. It lives beside the sandbox
server, which imports nothing else of the project, so every server shares it.
"""

from __future__ import annotations

import argparse
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from temporal_rollouts.sandbox_server.http.hosts import is_loopback

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

KEY_QUERY = "key"
"""A browser page (`rollouts view`) takes the key once in its address (`/?key=KEY`), then as a cookie."""


KEY_HELP = (
    "the environment variable holding the key every route but /health then needs ('Authorization: Bearer KEY'); "
    "required with a --host beyond loopback"
)


def add_key_argument(parser: argparse.ArgumentParser, help: str = KEY_HELP) -> None:
    """`--api-key-env NAME`, as every server of the project takes its key."""
    parser.add_argument("--api-key-env", default=None, metavar="NAME", help=help)


class KeyRequired(SystemExit):
    """A server asked to listen beyond loopback without a key (or given a key where every local process
    can read it); the message says how to start it."""


def is_loopback_bind(host: str) -> bool:
    """Whether a server bound to `host` is reachable from this machine alone: a loopback address or
    `localhost`; every other name, and 0.0.0.0 / :: (every address), is not."""
    return is_loopback(host.strip().lower())


def key_from_env(name: str | None) -> str | None:
    """The key in the environment variable `name` (removed from this process's environment, so the
    programs it starts do not inherit it), or None when no name is given. An empty or unset variable
    is an error: a server told to use a key must not start without one."""
    if name is None:
        return None
    key = os.environ.pop(name, "").strip()
    if not key:
        raise KeyRequired(f"environment variable {name} (--api-key-env) is not set or empty")
    return key


def require_key(host: str, key: str | None, server: str) -> None:
    """Refuse to start `server` on a non-loopback `host` without a key."""
    if key is None and not is_loopback_bind(host):
        raise KeyRequired(
            f"{server} listens on {host}, beyond this machine, and has no key: put one in an environment "
            "variable and name it with --api-key-env NAME (clients then send 'Authorization: Bearer KEY'), "
            "or listen on 127.0.0.1"
        )


def key_matches(presented: str | None, key: str) -> bool:
    """Whether `presented` (a header's or cookie's value, None when absent) is `key`, in constant time."""
    return presented is not None and hmac.compare_digest(presented.encode(), key.encode())


def bearer(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer TOKEN` header, or None."""
    scheme, _, token = (authorization or "").partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


class BearerKey:
    """ASGI middleware: every request but those to `open_paths` must carry the key, as a bearer token
    or, where `cookie` names one (a page a browser shows), as that cookie; such a page takes the key
    once as `?key=KEY` and answers with the cookie set. Without a key it lets everything through
    (a loopback server: `require_key`)."""

    def __init__(
        self, app: ASGIApp, key: str | None, open_paths: Iterable[str] = ("/health",), cookie: str | None = None
    ) -> None:
        self.app, self.key, self.open_paths, self.cookie = app, key, frozenset(open_paths), cookie

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.key is None or scope["type"] not in ("http", "websocket") or scope["path"] in self.open_paths:
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if key_matches(bearer(headers.get("authorization")), self.key) or (
            self.cookie is not None and key_matches(_cookies(headers.get("cookie")).get(self.cookie), self.key)
        ):
            await self.app(scope, receive, send)
            return
        if self.cookie is not None and key_matches(_query(scope).get(KEY_QUERY), self.key):
            await self.app(scope, receive, self._setting_cookie(send))
            return
        await _refuse(send)

    def _setting_cookie(self, send: Send) -> Send:
        assert self.cookie is not None and self.key is not None
        value = f"{self.cookie}={self.key}; HttpOnly; SameSite=Strict; Path=/".encode()

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), (b"set-cookie", value)]}
            await send(message)

        return sending


def _headers(scope: Scope) -> dict[str, str]:
    return {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope.get("headers", [])}


def _cookies(header: str | None) -> dict[str, str]:
    pairs = (part.strip().partition("=") for part in (header or "").split(";"))
    return {name: value for name, _, value in pairs if name}


def _query(scope: Scope) -> dict[str, str]:
    from urllib.parse import parse_qsl

    return dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))


async def _refuse(send: Send) -> None:
    body = b'{"error": {"message": "missing or wrong key (Authorization: Bearer KEY)", "code": 401}}'
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", b"Bearer"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
