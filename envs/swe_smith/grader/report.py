"""The one line a grading command ends with, and how the env reads it back.

A grading command runs every test of an instance, so its pytest summaries could outgrow the
sandbox's output cap; the slot parses them and prints one short JSON line instead: an outcome
letter per graded test (in the order the env sent them), the first failure messages, what
the grader took from the agent's repository and what it ignored, and the canary's outcome letter
in each pytest run (`grader.canary`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field

from .canary import forged

REPORT_MARKER = "swe-grader-report "
OUTCOME_CODES = {
    "PASSED": "P",
    "FAILED": "F",
    "ERROR": "E",
    "SKIPPED": "s",
    "XFAIL": "x",
    "XPASS": "X",
    "MISSING": "?",
    "TIMEOUT": "T",
}
"""MISSING: pytest said nothing of the test; TIMEOUT: its chunk ran out of time."""
OUTCOME_NAMES = {code: name for name, code in OUTCOME_CODES.items()}
LISTED_MESSAGES = 10
MESSAGE_CHARS = 300
LISTED_PATHS = 20


@dataclass
class Report:
    installed: bool
    outcomes: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)
    changes: dict[str, object] = field(default_factory=dict)
    canary: str = ""
    """The canary's outcome letter in each pytest run; empty where no canary was planted."""
    stopped: str | None = None
    """How the grading command ended, where it did not end with the grader's one report after the
    install (`read_grading`); None otherwise."""

    @property
    def tampered(self) -> str | None:
        """Why the code under test is taken to have tampered with this grade, or None: some run
        reported the canary (a test that fails) as passed, or the grader stopped before reporting."""
        if forged(self.canary):
            return f"the canary test, which fails, was reported passed (outcomes per run: {self.canary})"
        if self.stopped is not None:
            return f"the grader did not end with its one report after the install ({self.stopped})"
        return None


def report_line(
    targets: list[str],
    outcomes: dict[str, str],
    messages: dict[str, str],
    changes: dict[str, object],
    canary: Sequence[str] = (),
) -> str:
    failing = [nodeid for nodeid in targets if outcomes.get(nodeid) != "PASSED" and nodeid in messages]
    body = {
        "installed": True,
        "outcomes": "".join(OUTCOME_CODES.get(outcomes.get(nodeid, "MISSING"), "?") for nodeid in targets),
        "messages": {str(targets.index(n)): messages[n][:MESSAGE_CHARS] for n in failing[:LISTED_MESSAGES]},
        "changes": changes,
        "canary": "".join(OUTCOME_CODES.get(outcome, "?") for outcome in canary),
    }
    return REPORT_MARKER + json.dumps(body, sort_keys=True)


NOT_INSTALLED_LINE = REPORT_MARKER + json.dumps({"installed": False})
INSTALLED_LINE = "swe-grader-installed"
"""The grading command's line once the base is installed: from there on, the agent's code runs."""


def summarize_changes(taken: list[str], deleted: list[str], ignored: dict[str, str]) -> dict[str, object]:
    """What the grader took and ignored, cut to a size that fits a verdict."""
    return {
        "taken": taken[:LISTED_PATHS],
        "deleted": deleted[:LISTED_PATHS],
        "ignored": dict(sorted(ignored.items())[:LISTED_PATHS]),
        "counts": {"taken": len(taken), "deleted": len(deleted), "ignored": len(ignored)},
    }


def read_grading(output: str, targets: list[str], exit_code: int | None, timed_out: bool) -> Report | None:
    """The report of a whole grading command, or None when it failed before the install ended.

    Once the base is installed the tests import the agent's code with the grader's uid, so a command
    that then does not end as the grader ends it (exit 0, one report line) was stopped by that code
    (killed or frozen), or that code printed a report of its own: the report says so (`stopped`)."""
    lines = output.splitlines()
    reports = sum(line.startswith(REPORT_MARKER) for line in lines)
    if INSTALLED_LINE in lines and (exit_code != 0 or timed_out or reports != 1):
        how = "timed out" if timed_out else f"exit {exit_code}"
        return Report(installed=True, stopped=f"{how}, {reports} report lines")
    return read_report(output, targets)


def read_report(output: str, targets: list[str]) -> Report | None:
    """The report in a grading command's output (its last readable report line), or None when there is none."""
    body = None
    for line in reversed(output.splitlines()):
        if line.startswith(REPORT_MARKER):
            try:
                body = json.loads(line[len(REPORT_MARKER) :])
                break
            except ValueError:
                continue
    if not isinstance(body, dict):
        return None
    if not body.get("installed"):
        return Report(installed=False)
    try:
        codes = str(body.get("outcomes", ""))
        outcomes = {nodeid: OUTCOME_NAMES.get(codes[i : i + 1], "MISSING") for i, nodeid in enumerate(targets)}
        said = body.get("messages", {}).items()
        messages = {targets[int(i)]: str(text) for i, text in said if 0 <= int(i) < len(targets)}
        return Report(
            installed=True,
            outcomes=outcomes,
            messages=messages,
            changes=dict(body.get("changes", {})),
            canary=str(body.get("canary", "")),
        )
    except (AttributeError, TypeError, ValueError):
        return None
