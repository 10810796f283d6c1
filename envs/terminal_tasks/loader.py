"""Reads the bundled tasks from `tasks/<id>.json`, once per process."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from envs.terminal_tasks.model import TerminalTask

TASKS_DIR = Path(__file__).with_name("tasks")


def load_tasks_from(directory: Path) -> dict[str, TerminalTask]:
    """Every task in `directory`, by id, in file-name order; a file must be named after its task."""
    tasks: dict[str, TerminalTask] = {}
    for path in sorted(directory.glob("*.json")):
        task = TerminalTask.model_validate(json.loads(path.read_text()))
        if task.id != path.stem:
            raise ValueError(f"{path.name}: task id {task.id!r} does not match the file name")
        tasks[task.id] = task
    return tasks


@functools.cache
def bundled_tasks() -> dict[str, TerminalTask]:
    return load_tasks_from(TASKS_DIR)
