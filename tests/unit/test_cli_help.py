"""Every `rollouts` command's --help names a flag's default at most once, and never as None or False."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator

from temporal_rollouts.cli.main import build_parser


def commands(parser: argparse.ArgumentParser, name: str = "rollouts") -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield name, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub_name, sub in action.choices.items():
                yield from commands(sub, f"{name} {sub_name}")


def test_defaults_are_shown_once_and_only_when_they_say_something() -> None:
    for name, parser in commands(build_parser()):
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


def test_the_stale_groups_choices_are_the_feeds_own() -> None:
    from temporal_rollouts.cli.parsers import STALE_GROUPS
    from temporal_rollouts.core.feed import StaleGroups

    assert STALE_GROUPS == tuple(choice.value for choice in StaleGroups)
