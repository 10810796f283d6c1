"""Reads test outcomes from pytest's `-rA` short summary, for the generator and the grader alike.

Each summary line is `OUTCOME nodeid[ - message]`. Test ids may themselves contain ` - `
(parametrized ids), so where the ids asked for are known the longest known prefix wins.
"""

from __future__ import annotations

import re

SUMMARY_OUTCOMES = ("PASSED", "FAILED", "ERROR", "SKIPPED", "XFAIL", "XPASS")
PYTEST_FLAGS = ("-q", "-rA", "--tb=line", "--show-capture=no", "-p", "no:cacheprovider")
"""Flags of every pytest run whose summary is read here (the lines must be there and unclipped:
run with COLUMNS set wide)."""


def parse_summary(output: str, known: set[str] | frozenset[str] = frozenset()) -> tuple[dict[str, str], dict[str, str]]:
    """Outcome and failure message by test id. With `known` ids, lines naming other ids are ignored."""
    outcomes: dict[str, str] = {}
    messages: dict[str, str] = {}
    for line in output.splitlines():
        outcome, _, rest = line.partition(" ")
        if outcome not in SUMMARY_OUTCOMES or not rest:
            continue
        nodeid, message = rest, ""
        if known:
            match = max((k for k in _prefixes(rest) if k in known), key=len, default=None)
            if match is None:
                continue
            nodeid, message = match, rest[len(match) :].removeprefix(" - ")
        elif outcome != "PASSED":
            nodeid, _, message = rest.partition(" - ")
        outcomes[nodeid] = outcome
        if message:
            messages[nodeid] = message
    return outcomes, messages


def _prefixes(text: str) -> list[str]:
    cuts = [m.start() for m in re.finditer(" - ", text)]
    return [text, *(text[:cut] for cut in cuts)]
