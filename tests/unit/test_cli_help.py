"""Every `rollouts` command's --help names a flag's default at most once, and never as None or False."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

from temporal_rollouts.cli.main import build_parser
from temporal_rollouts.view.serve import build_parser as view_parser


def commands(parser: argparse.ArgumentParser, name: str = "rollouts") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from commands(sub, f"{name} {sub_name}")


def test_defaults_are_shown_once_and_only_when_they_say_something() -> None:
    for name, parser in [*commands(build_parser()), ("rollouts view", view_parser())]:
        for action in parser._actions:
            if not action.option_strings or action.help in (None, argparse.SUPPRESS):
                continue
            formatter = parser._get_formatter()
            help_text = " ".join(formatter._expand_help(action).split())
            assert "(default: None)" not in help_text and "(default: False)" not in help_text, (name, help_text)
            if "(default: " in help_text:  # argparse's own: never beside one the help text names itself
                assert len(re.findall(r"\bdefault\b", help_text)) == 1, (name, help_text)


def test_the_top_level_help_imports_none_of_what_the_commands_use() -> None:
    """`rollouts --help` must answer at once (bench/cli_help.py times it): building every parser and
    printing the help loads neither pydantic, nor the Temporal client, nor rich, nor an env."""
    probe = (
        "import sys\n"
        "from temporal_rollouts.cli.main import build_parser\n"
        "parser = build_parser()\n"
        "parser.format_help()\n"
        "parser.parse_args(['list', '--limit', '3'])\n"
        "heavy = sorted(m for m in sys.modules if m.split('.')[0] in ('pydantic', 'temporalio', 'rich', 'envs'))\n"
        "print(' '.join(heavy))\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True)
    assert done.stdout.strip() == "", done.stdout


def test_the_stale_groups_and_rebuild_choices_are_the_models_own() -> None:
    from typing import get_args

    from temporal_rollouts.cli.parsers import STALE_GROUPS, WORKSPACE_REBUILDS
    from temporal_rollouts.core.feed import StaleGroups
    from temporal_rollouts.core.forks import WorkspaceRebuild

    assert STALE_GROUPS == tuple(choice.value for choice in StaleGroups)
    assert WORKSPACE_REBUILDS == get_args(WorkspaceRebuild)


def test_every_flag_that_sets_an_input_field_defaults_to_the_fields_own_default() -> None:
    """One default per setting: a flag left out gives what the input model would give on its own."""
    from temporal_rollouts.core.feed import FeedInput
    from temporal_rollouts.core.forks import ForkSpec
    from temporal_rollouts.core.inputs import field_default
    from temporal_rollouts.cli.main import _batch_input
    from temporal_rollouts.core.records import BatchInput, RolloutLimits
    from temporal_rollouts.core.settings import Settings

    parser = build_parser()
    batch = vars(parser.parse_args(["batch", "--env", "x"]))
    start = vars(parser.parse_args(["train", "start", "run", "--env", "x"]))
    fork = vars(parser.parse_args(["fork", "r", "--at-turn", "1"]))
    demo = vars(parser.parse_args(["demo"]))
    flags = [
        (BatchInput, "num_items", _batch_input(parser.parse_args(["batch", "--env", "x"]), Settings()).num_items),
        (BatchInput, "group_size", batch["group_size"]),
        (BatchInput, "item_offset", batch["offset"]),
        (BatchInput, "max_concurrency", batch["max_concurrency"]),
        (BatchInput, "start_rate", batch["start_rate"]),
        (FeedInput, "group_size", start["group_size"]),
        (FeedInput, "max_staleness", start["max_staleness"]),
        (FeedInput, "stale_groups", start["stale_groups"]),
        (FeedInput, "max_groups_in_flight", start["in_flight"]),
        (FeedInput, "max_groups", start["max_groups"]),
        (FeedInput, "max_retries", start["max_retries"]),
        (FeedInput, "sink", start["sink"]),
        (ForkSpec, "rebuild", fork["rebuild"]),
        (BatchInput, "group_size", demo["group_size"]),
    ]
    for model, field, value in flags:
        assert value == field_default(model, field), (model.__name__, field, value)
    batch_help = " ".join(parser._subparsers._group_actions[0].choices["batch"].format_help().split())
    assert f"model turns per rollout (default {field_default(RolloutLimits, 'max_turns')})" in batch_help
    assert f"(default {field_default(BatchInput, 'num_items')}; with --tasks, every task" in batch_help
    assert batch["items"] is None, "left out, --items is resolved when the env is known (--tasks: every task)"
