"""What the project's web programs that read the settings share (`rollouts view`, the trainer door's
endpoint): the flags that say where one listens, and its `main` around the serving itself: the key
checked before anything is loaded or bound, the settings read, the server run until Ctrl-C, and an
error a person can read. Until it serves, it imports only argparse and the key checks, so `--help`
and a refusal answer at once."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from temporal_rollouts.sandbox_server.http.keys import key_from_env, require_key

if TYPE_CHECKING:
    from temporal_rollouts.core.settings import Settings

Serve = Callable[[argparse.Namespace, "Settings", "str | None"], Awaitable[None]]


def add_listening_arguments(parser: argparse.ArgumentParser, port: int, what: str) -> None:
    """`--host`, `--port` and `--allowed-host` for `what` (the page, the endpoint)."""
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help=f"address to bind; beyond loopback {what} needs a key (--api-key-env) (default: %(default)s)",
    )
    parser.add_argument("--port", type=int, default=port, help="(default: %(default)s)")
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        help=f"another name {what} is reached by (repeatable); it refuses every other Host header",
    )


def serve_until_stopped(args: argparse.Namespace, name: str, serve: Serve) -> int:
    """Refuse `name` beyond loopback without a key, then `serve(args, settings, key)` until Ctrl-C (130); an
    error a command expects is one line on stderr and its exit code."""
    key = key_from_env(args.api_key_env)
    require_key(args.host, key, name)
    import asyncio

    from temporal_rollouts.runtime.command_errors import report_error
    from temporal_rollouts.runtime.config import load_settings

    settings: Settings | None = None
    try:
        settings = load_settings()
        asyncio.run(serve(args, settings, key))
    except KeyboardInterrupt:
        return 130
    except Exception as err:
        return report_error(err, settings)
    return 0
