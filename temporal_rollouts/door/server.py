"""The door's endpoint as a program: stateless, so run as many as you like, anywhere the workers'
Temporal and object store are reachable.

    python -m temporal_rollouts.door [--host 127.0.0.1] [--port 8780] [--api-key-env NAME] [--allowed-host NAME]
    rollouts train serve ...                  (the same)

It reads the same settings as the worker (`ROLLOUTS_*`, the config file): the Temporal address
and the object store the run's groups are in. A store that is a local folder is on one machine
only; endpoints on other machines need the S3 store (`storage.type = "s3"`).
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.door.app import create_app
from temporal_rollouts.door.runs import RunDoors
from temporal_rollouts.sandbox_server.hosts import AllowedHosts
from temporal_rollouts.storage.feed_groups import FeedGroupStore
from temporal_rollouts.storage.objects import object_client

DEFAULT_PORT = 8780


class KeyRequired(SystemExit):
    """Asked to listen beyond loopback without a key; the message says how to start it."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (beyond loopback: a key)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument(
        "--api-key-env",
        default=None,
        metavar="NAME",
        help="the environment variable holding the key every route but /health then needs "
        "('Authorization: Bearer KEY'); required with a --host beyond loopback",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        help="another name the endpoint is reached by (repeatable); any other Host header is refused",
    )
    parser.add_argument(
        "--atropos-lease-s",
        type=float,
        default=600.0,
        help="how long a batch an Atropos trainer takes (GET /batch) stays leased before it is handed out again",
    )


def key_from(args: argparse.Namespace) -> str | None:
    """The key in the environment variable `--api-key-env` names (removed from this process's environment,
    never on the command line, where every local process can read it); refuse a non-loopback host without one."""
    key = None
    if args.api_key_env is not None:
        key = os.environ.pop(args.api_key_env, "").strip()
        if not key:
            raise KeyRequired(f"environment variable {args.api_key_env} (--api-key-env) is not set or empty")
    if key is None and not _loopback(args.host):
        raise KeyRequired(
            f"the door listens on {args.host}, beyond this machine, and has no key: put one in an environment "
            "variable and name it with --api-key-env NAME, or listen on 127.0.0.1"
        )
    return key


def _loopback(host: str) -> bool:
    """Reachable from this machine alone: `localhost` or a loopback address (never 0.0.0.0, every address)."""
    host = host.strip().lower().strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(args: argparse.Namespace, settings: Settings) -> int:
    import uvicorn

    from temporal_rollouts.runtime.temporal import connect

    key = key_from(args)
    objects = object_client(settings)
    client = await connect(settings, objects=objects, start_embedded=False)
    doors = RunDoors(client, FeedGroupStore(objects, settings.storage.bucket))
    app = create_app(doors, key, AllowedHosts.for_bind(args.host, args.allowed_hosts), args.atropos_lease_s)
    print(f"the trainer door listens on http://{args.host}:{args.port}/runs/<run>", flush=True)
    await uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).serve()
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    args = parser.parse_args(argv)
    raise SystemExit(asyncio.run(serve(args, Settings())))
