"""Every HTTP server of the project answers only to its own names (a defence against DNS rebinding).

A web page the user visits can point a name it controls at 127.0.0.1 and then read, from the
user's own browser, whatever a loopback server answers: every conversation in `rollouts view`,
the demo policy, a sandbox server's public endpoints. The browser still sends the page's name in
the Host header, so a server that refuses names that are not its own is out of reach.

Which names are a server's own follows from where it listens: on a loopback address, the
loopback names; on one address, that address; on every address (0.0.0.0, ::), this machine's
names and addresses. Names it is reached by that it cannot know (a load balancer, a tunnel, a
service name in compose) are added with `extra` (`--allowed-host`): a leading dot allows every
subdomain (`.modal.host`), and `*` turns the check off. Refused requests get 421 Misdirected
Request. It lives beside the sandbox server, which imports nothing else of the project, so that
it and every other server share it.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
WILDCARD_BINDS = frozenset({"", "0.0.0.0", "::"})


@dataclass(frozen=True)
class AllowedHosts:
    names: frozenset[str]
    suffixes: tuple[str, ...] = ()
    anything: bool = False

    @classmethod
    def for_bind(cls, bind_host: str, extra: Iterable[str] = ()) -> AllowedHosts:
        """The names a server listening on `bind_host` answers to, and `extra`."""
        names = {bind_host.strip("[]").lower()}
        if bind_host in WILDCARD_BINDS or is_loopback(bind_host):
            names |= LOOPBACK_NAMES
        if bind_host in WILDCARD_BINDS:
            names |= _own_names()
        extra = [entry.strip().lower() for entry in extra if entry.strip()]
        return cls(
            names=frozenset(names | {e for e in extra if not e.startswith(".") and e != "*"}),
            suffixes=tuple(e for e in extra if e.startswith(".")),
            anything="*" in extra,
        )

    def permits(self, host_header: str | None) -> bool:
        if self.anything:
            return True
        if not host_header:
            return False
        host = _without_port(host_header.strip().lower())
        return (
            host in self.names
            or is_loopback(host)
            and bool(self.names & LOOPBACK_NAMES)
            or any(host.endswith(suffix) for suffix in self.suffixes)
        )


class HostGuard:
    """ASGI middleware: requests whose Host header is not one of `allowed` get 421 and nothing else."""

    def __init__(self, app: Any, allowed: AllowedHosts) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] in ("http", "websocket"):
            host = next((value.decode("latin-1") for key, value in scope["headers"] if key == b"host"), None)
            if not self.allowed.permits(host):
                if scope["type"] == "websocket":
                    await send({"type": "websocket.close", "code": 1008})
                    return
                body = b"this server does not answer to that host name"
                await send(
                    {
                        "type": "http.response.start",
                        "status": 421,
                        "headers": [(b"content-type", b"text/plain"), (b"content-length", str(len(body)).encode())],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)


def _without_port(host: str) -> str:
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or `localhost`) is this machine's loopback."""
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def _own_names() -> set[str]:
    names = {socket.gethostname().lower(), socket.getfqdn().lower()}
    for name in list(names):
        try:
            names |= {info[4][0].lower() for info in socket.getaddrinfo(name, None)}
        except OSError:
            pass
    return names
