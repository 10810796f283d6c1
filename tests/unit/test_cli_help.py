"""Every `rollouts` command's --help names a flag's default at most once, and never as None or False."""

from __future__ import annotations

import argparse
import re
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
            help_text = " ".join((formatter._get_help_string(action) or "").split()) % {**vars(action), "prog": name}
            assert "(default: None)" not in help_text and "(default: False)" not in help_text, (name, help_text)
            if "(default: " in help_text:  # argparse's own: never beside one the help text names itself
                assert len(re.findall(r"\bdefault\b", help_text)) == 1, (name, help_text)
