"""The help formatter of every `rollouts` command: a default is shown once, and only when it says something.

argparse's ArgumentDefaultsHelpFormatter appends `(default: None)` to every optional flag and a
second default to a help text that already names one (`(default 30) (default: None)`).
"""

from __future__ import annotations

import argparse


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
