"""Sandbox bearer tokens derived from one pool secret, so no token is ever stored or shipped.

With a remote backend every worker host must be able to talk to every sandbox
server, yet a token file on one host's disk is not something another host can
read, and a token in a workflow input would sit in its history for anyone with
UI access. So each server's token is HMAC-SHA256(pool secret, container id):
any process that holds the secret (workers, and the backend that starts the
server and hands it its token through the backend's own secret store) can work
it out, and a leaked token opens only the one server it belongs to.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from temporal_rollouts.core.errors import ConfigError

MIN_SECRET_CHARS = 16


def derive_token(secret: str, container_id: str) -> str:
    """The bearer token of one container: hex HMAC-SHA256 of its id under the pool secret."""
    return hmac.new(secret.encode(), container_id.encode(), hashlib.sha256).hexdigest()


class PoolSecret:
    """The pool secret, read once from the environment variable a backend config names."""

    def __init__(self, secret: str, source: str = "the pool secret") -> None:
        if len(secret) < MIN_SECRET_CHARS:
            raise ConfigError(f"{source} must be at least {MIN_SECRET_CHARS} characters long")
        self._secret = secret
        self.source = source

    @classmethod
    def from_env(cls, name: str) -> PoolSecret:
        value = os.environ.get(name, "")
        if not value:
            raise ConfigError(
                f"the sandbox pool secret is read from ${name}, which is not set: set it to the same random "
                f"value on every worker host (e.g. `export {name}=$(openssl rand -hex 32)`)"
            )
        return cls(value, f"${name}")

    def token(self, container_id: str) -> str:
        return derive_token(self._secret, container_id)

    def __repr__(self) -> str:
        return f"PoolSecret({self.source})"
