"""The trainer door's endpoint as a program: stateless, so run as many as you like, anywhere the
workers' Temporal and object store are reachable.

    python -m temporal_rollouts.door [--host 127.0.0.1] [--port 8780] [--api-key-env NAME] [--allowed-host NAME]
    rollouts train serve ...                  (runs this program in its own place)

It reads the same settings as the worker (`ROLLOUTS_*`, the config file): the Temporal address
and the object store the run's groups are in, and it refuses a task queue whose workers keep their
data elsewhere. A store that is a local folder is on one machine only; endpoints on other machines
need the S3 store (`storage.type = "s3"`). Until it serves, it imports only argparse and the key
checks: an endpoint that would listen beyond loopback without a key is refused before anything is
loaded or bound.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from temporal_rollouts.runtime.serving import add_listening_arguments, serve_until_stopped
from temporal_rollouts.sandbox_server.http.keys import add_key_argument

if TYPE_CHECKING:
    from temporal_rollouts.core.settings import Settings

PORT = 8780


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollouts train serve",
        description="The trainer door: trainers take training runs' numbered batches and acknowledge them, over "
        "HTTP (/runs/RUN/take, /runs/RUN/batches/N/ack) or Atropos' /register and /batch.",
    )
    add_listening_arguments(parser, PORT, "the endpoint")
    parser.add_argument(
        "--atropos-lease-s",
        type=float,
        default=600.0,
        help="how long a batch an Atropos trainer takes (GET /batch) stays leased before it is handed out again "
        "(default: %(default)s)",
    )
    add_key_argument(parser)
    return parser


async def serve(args: argparse.Namespace, settings: Settings, key: str | None) -> None:
    import uvicorn

    from temporal_rollouts.client.door import run_doors
    from temporal_rollouts.door.app import create_app
    from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts

    doors = await run_doors(settings)
    app = create_app(doors, key, AllowedHosts.for_bind(args.host, args.allowed_hosts), args.atropos_lease_s)
    print(
        f"the trainer door: http://{args.host}:{args.port}/runs/<run>  (Temporal {settings.temporal_address}; "
        "Ctrl-C stops it)",
        flush=True,
    )
    await uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).serve()


def main(argv: list[str] | None = None) -> int:
    # any caller could take and acknowledge a run's batches: beyond loopback, a key
    return serve_until_stopped(build_parser().parse_args(argv), "the trainer door", serve)
