"""Toolsets: named groups of tools, and distributions that draw them per group.

The names follow the system we replace (its `enabled_toolsets`, `disabled_toolsets`
and `distribution` settings), limited to the tools our sandbox serves: each toolset
in a distribution is drawn independently with its percentage; when none is drawn
the most likely one is used, so a group is never offered no tools.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from temporal_rollouts.core.errors import ConfigError

TOOLSETS: dict[str, tuple[str, ...]] = {
    "terminal": ("terminal", "terminal_stateful", "tmux"),
    "file": ("read_file", "write_file", "search"),
}
TOOLSETS["default"] = TOOLSETS["terminal"] + TOOLSETS["file"]

DISTRIBUTIONS: dict[str, dict[str, float]] = {
    "default": {"terminal": 100, "file": 100},
    "terminal_only": {"terminal": 100},
    "terminal_tasks": {"terminal": 100, "file": 80},
    "development": {"terminal": 90, "file": 90},
    "file_tasks": {"file": 100, "terminal": 30},
}


def resolve_tools(
    enabled: Sequence[str] | None = None,
    disabled: Sequence[str] | None = None,
    distribution: str | None = None,
    rng: random.Random | None = None,
) -> list[str]:
    """Tool names for one group: drawn from `distribution` when set, else the enabled
    toolsets (all when None) minus the disabled ones."""
    if distribution is not None:
        if distribution not in DISTRIBUTIONS:
            raise ConfigError(f"unknown toolset distribution {distribution!r}; known: {sorted(DISTRIBUTIONS)}")
        odds = DISTRIBUTIONS[distribution]
        draw = rng or random.Random()
        chosen = [name for name, percent in odds.items() if draw.uniform(0, 100) < percent]
        names = chosen or [max(odds, key=odds.__getitem__)]
    else:
        names = list(enabled) if enabled is not None else ["default"]
    unknown = sorted({*names, *(disabled or ())} - TOOLSETS.keys())
    if unknown:
        raise ConfigError(f"unknown toolsets {unknown}; known: {sorted(TOOLSETS)}")
    dropped = {tool for name in disabled or () for tool in TOOLSETS[name]}
    tools: list[str] = []
    for name in names:
        tools.extend(t for t in TOOLSETS[name] if t not in dropped and t not in tools)
    if not tools:
        raise ConfigError(f"no tools left: enabled {names}, disabled {list(disabled or ())}")
    return tools
