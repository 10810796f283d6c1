"""Toolset resolution (envs.toolsets) and the env-level `tools` / `system_prompt` config."""

from __future__ import annotations

import random

import pytest

from envs import get_env
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.tools.toolsets import DISTRIBUTIONS, resolve_tools


def test_enabled_minus_disabled() -> None:
    stateful = ["terminal_stateful", "tmux"]
    assert resolve_tools() == ["terminal", *stateful, "read_file", "write_file", "search"]
    assert resolve_tools(["terminal", "file"], ["file"]) == ["terminal", *stateful]
    assert resolve_tools(["file"]) == ["read_file", "write_file", "search"]


def test_a_distribution_draws_each_toolset_on_its_own_odds() -> None:
    rng = random.Random(7)
    draws = [tuple(resolve_tools(distribution="file_tasks", rng=rng)) for _ in range(2_000)]
    with_terminal = sum("terminal" in d for d in draws) / len(draws)
    assert all("read_file" in d for d in draws), "file is drawn at 100%"
    assert 0.25 < with_terminal < 0.35, with_terminal
    assert resolve_tools(distribution="terminal_only", rng=rng) == ["terminal", "terminal_stateful", "tmux"]


def test_nothing_drawn_falls_back_to_the_most_likely_toolset() -> None:
    class Never(random.Random):
        def uniform(self, a, b):  # every draw misses
            return b

    DISTRIBUTIONS["rare"] = {"terminal": 1, "file": 5}
    try:
        assert resolve_tools(distribution="rare", rng=Never()) == ["read_file", "write_file", "search"]
    finally:
        del DISTRIBUTIONS["rare"]


def test_unknown_names_and_empty_results_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="unknown toolsets"):
        resolve_tools(["browser"])
    with pytest.raises(ConfigError, match="unknown toolset distribution"):
        resolve_tools(distribution="nope")
    with pytest.raises(ConfigError, match="no tools left"):
        resolve_tools(["terminal"], ["terminal"])


def test_env_config_narrows_tools_and_replaces_the_system_prompt() -> None:
    env = get_env("terminal_tasks", {"tools": ["terminal"], "system_prompt": "Be brief."})
    assert [t.name for t in env.tool_specs()] == ["terminal"]
    item = env.load_items(1)[0]
    assert env.prompt_messages(item)[0].content == "Be brief."
    default = get_env("terminal_tasks")
    assert len(default.tool_specs()) == 5 and default.prompt_messages(item)[0].content != "Be brief."
