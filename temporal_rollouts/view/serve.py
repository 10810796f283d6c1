"""`rollouts view`: serve the web page of this package until Ctrl-C (`python -m temporal_rollouts.view`).

`rollouts view` runs this program in its own place with the flags as given, so the page owns its
flags and its help. Until it serves, it imports only argparse and the key checks: a page that would
listen beyond loopback without a key is refused before anything is loaded or bound.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from temporal_rollouts.runtime.serving import add_listening_arguments, serve_until_stopped
from temporal_rollouts.sandbox_server.http.keys import add_key_argument

if TYPE_CHECKING:
    from temporal_rollouts.core.settings import Settings

PORT = 8300


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="rollouts view",
        description="A local web page of batches, training runs, their rollouts and figures, one trajectory at "
        "a time; it also serves a codec endpoint for the Temporal UI.",
    )
    add_listening_arguments(parser, PORT, "the page")
    add_key_argument(
        parser,
        "the environment variable holding the page's key: open it once as /?key=KEY (a cookie keeps it), "
        "or send 'Authorization: Bearer KEY'; required with a --host beyond loopback",
    )
    return parser


async def serve(args: argparse.Namespace, settings: Settings, key: str | None) -> None:
    import uvicorn

    from temporal_rollouts.client.connection import inspection_client
    from temporal_rollouts.client.slots import describe_sandboxes
    from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts
    from temporal_rollouts.view.app import create_app

    client, transcripts = await inspection_client(settings)
    origins = [settings.ui_url.rstrip("/")] if settings.ui_url else []
    app = create_app(
        client,
        transcripts,
        origins,
        AllowedHosts.for_bind(args.host, args.allowed_hosts),
        key,
        sandboxes=lambda: describe_sandboxes(settings),
    )
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")
    opened = f"?key=<the key in ${args.api_key_env}>" if key else ""
    print(
        f"rollouts view: http://{args.host}:{args.port}/{opened}  (Temporal {settings.temporal_address}; Ctrl-C stops it)\n"
        f"codec endpoint for the Temporal UI: http://{args.host}:{args.port}/codec",
        flush=True,
    )
    await uvicorn.Server(config).serve()


def main(argv: list[str] | None = None) -> int:
    return serve_until_stopped(build_parser().parse_args(argv), "rollouts view", serve)  # it shows every conversation
