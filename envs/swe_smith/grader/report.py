"""The one line a grading command ends with, and how the env reads it back.

A grading command runs every test of an instance, so its pytest summaries could outgrow the
sandbox's output cap; the slot parses them and prints one short JSON line instead: an outcome
letter per graded test (in the order the env sent them), the first failure messages, and what
the grader took from the agent's repository and what it ignored.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

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


def report_line(
    targets: list[str], outcomes: dict[str, str], messages: dict[str, str], changes: dict[str, object]
) -> str:
    failing = [nodeid for nodeid in targets if outcomes.get(nodeid) != "PASSED" and nodeid in messages]
    body = {
        "installed": True,
        "outcomes": "".join(OUTCOME_CODES.get(outcomes.get(nodeid, "MISSING"), "?") for nodeid in targets),
        "messages": {str(targets.index(n)): messages[n][:MESSAGE_CHARS] for n in failing[:LISTED_MESSAGES]},
        "changes": changes,
    }
    return REPORT_MARKER + json.dumps(body, sort_keys=True)


NOT_INSTALLED_LINE = REPORT_MARKER + json.dumps({"installed": False})


def summarize_changes(taken: list[str], deleted: list[str], ignored: dict[str, str]) -> dict[str, object]:
    """What the grader took and ignored, cut to a size that fits a verdict."""
    return {
        "taken": taken[:LISTED_PATHS],
        "deleted": deleted[:LISTED_PATHS],
        "ignored": dict(sorted(ignored.items())[:LISTED_PATHS]),
        "counts": {"taken": len(taken), "deleted": len(deleted), "ignored": len(ignored)},
    }


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
        return Report(installed=True, outcomes=outcomes, messages=messages, changes=dict(body.get("changes", {})))
    except (AttributeError, TypeError, ValueError):
        return None
