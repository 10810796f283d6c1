"""The help formatter of every `rollouts` command: a default is shown once, and only when it says something.

argparse's ArgumentDefaultsHelpFormatter appends `(default: None)` to every optional flag and a
second default to a help text that already names one (`(default 30) (default: None)`).

A help text may name `%(envs)s`, the registered envs: they are looked up only when that help is
printed, since importing the envs costs what `rollouts --help` must not.
"""

from __future__ import annotations

import argparse
import copy


def registered_envs() -> str:
    from envs.registry import env_names

    return ", ".join(sorted(env_names()))


class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    def _get_help_string(self, action: argparse.Action) -> str | None:
        help_text = action.help or ""
        if (
            action.default is None
            or action.default is False
            or action.default == argparse.SUPPRESS
            or "default" in help_text
        ):
            return help_text
        return super()._get_help_string(action)

    def _expand_help(self, action: argparse.Action) -> str:
        if action.help and "%(envs)s" in action.help:
            action = copy.copy(action)
            action.help = action.help.replace("%(envs)s", registered_envs())
        return super()._expand_help(action)
