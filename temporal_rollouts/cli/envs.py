"""`rollouts envs`, and the lines a command prints about the env it names (client/envs.py finds them).

The CLI loads the same sources as a worker. A name it still does not know may be one a worker
knows, so it is not refused: a one-line notice says the batch's first step checks it on the worker.
"""

from __future__ import annotations

import argparse
import json
import sys

from temporal_rollouts.client.envs import load_envs, unknown_env_note
from temporal_rollouts.core.settings import Settings


def note_unknown_env(name: str, settings: Settings) -> bool:
    """True when this process knows the env `name`; otherwise a one-line notice that the worker will check it
    (and, once each, a line for every env source that failed to load)."""
    for line in load_envs(settings):
        print(f"warning: {line}", file=sys.stderr)
    note = unknown_env_note(name)
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    return note is None


async def cmd_envs(args: argparse.Namespace, settings: Settings) -> int:
    from envs.registry import env_class, env_names, env_origin
    from envs.sources import load_env_sources

    problems = load_env_sources(settings.env_modules)
    names = env_names()
    if args.json:
        rows = [{"name": name, **env_origin(name).model_dump(), "class": _qualified(env_class(name))} for name in names]
        print(json.dumps({"envs": rows, "failed": [problem.model_dump() for problem in problems]}))
    else:
        width = max(map(len, names), default=0)
        for name in names:
            print(f"{name:<{width}}  {env_origin(name).describe()}")
        for problem in problems:
            print(f"failed: {problem.line()}", file=sys.stderr)
    return 1 if problems else 0


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"
