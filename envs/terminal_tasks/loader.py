"""Reads the bundled tasks from `tasks/<id>.json` (and those that need their own image from
`image_tasks/<id>.json`, their build contexts in `images/`), once per process."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from envs.terminal_tasks.model import TerminalTask

TASKS_DIR = Path(__file__).with_name("tasks")
IMAGE_TASKS_DIR = Path(__file__).with_name("image_tasks")
IMAGES_DIR = Path(__file__).with_name("images")


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


@functools.cache
def bundled_image_tasks() -> dict[str, TerminalTask]:
    tasks = load_tasks_from(IMAGE_TASKS_DIR)
    for task in tasks.values():
        if task.image is None or not (IMAGES_DIR / task.image / "Dockerfile").is_file():
            raise ValueError(f"image task {task.id!r} names no build context under {IMAGES_DIR}")
    return tasks
