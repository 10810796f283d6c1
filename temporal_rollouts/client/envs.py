"""How a command that names an env finds the envs the workers know.

A command loads the same sources as a worker (`envs.sources`: the bundled envs, installed
packages' entry points, the settings' `env_modules` and `--env-module`). A name it still does
not know may be one a worker knows (a worker started with another `--env-module`, on another
machine with other packages), so it is not refused here: the batch's first step checks it on
the worker, and the caller says so in one line.
"""

from __future__ import annotations

import difflib

from temporal_rollouts.core.settings import Settings

_reported: set[str] = set()


def load_envs(settings: Settings) -> list[str]:
    """Load every env source the settings name; a line for each that failed and was not reported before."""
    from envs.sources import load_env_sources

    lines = []
    for problem in load_env_sources(settings.env_modules):
        if problem.source not in _reported:
            _reported.add(problem.source)
            lines.append(problem.line())
    return lines


def unknown_env_note(name: str) -> str | None:
    """None when this process knows the env `name` (once `load_envs` ran); else the line that says the
    worker will check it, with the closest known name."""
    from envs.registry import env_names

    names = env_names()
    if name in names:
        return None
    close = difflib.get_close_matches(name, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else f" (known here: {', '.join(names)})"
    return f"env {name!r} is not known to this command{hint}; the batch's first step checks it on the worker"
