"""`rollouts envs`, and how every command that names an env finds the envs the workers know.

The CLI loads the same sources as a worker (`envs.sources`: the bundled envs, installed
packages' entry points, the settings' `env_modules` and `--env-module`). A name it still does
not know may be one a worker knows (a worker started with another `--env-module`, on another
machine with other packages), so it is not refused here: the batch's first step checks it on
the worker, and a one-line notice says so.
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any

from temporal_rollouts.core.settings import Settings

_reported: set[str] = set()


def add_env_module_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env-module",
        action="append",
        dest="env_modules",
        metavar="MODULE",
        help="also load the envs of this module (a name on the import path, or a .py file); repeatable, "
        "adds to settings env_modules",
    )


def load_envs(settings: Settings) -> None:
    """Load every env source the settings name; each one that fails is one line on stderr, once."""
    from envs.sources import load_env_sources

    problems = load_env_sources(settings.env_modules)
    for problem in problems:
        if problem.source not in _reported:
            _reported.add(problem.source)
            print(f"warning: {problem.line()}", file=sys.stderr)


def env_is_known(name: str, settings: Settings) -> bool:
    """True when this process knows the env `name`; otherwise a one-line notice that the worker will check it."""
    from envs.registry import env_names

    load_envs(settings)
    names = env_names()
    if name in names:
        return True
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known here: {', '.join(names)})"
    print(
        f"note: env {name!r} is not known to this command{hint}; the batch's first step checks it on the worker",
        file=sys.stderr,
    )
    return False


def add_parser(sub: Any) -> None:
    envs = sub.add_parser(
        "envs",
        help="every env, with where it comes from (bundled, a package's entry point, a module)",
        description="Every env this machine's settings load: bundled, installed packages' entry points "
        "(group temporal_rollouts.envs) and env_modules. Exits 1 when a source failed to load.",
    )
    add_env_module_flag(envs)
    envs.add_argument("--json", action="store_true", help="one JSON object: envs and the sources that failed")


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
