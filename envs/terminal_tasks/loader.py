"""Reads the bundled tasks, each a Harbor task folder (`docs/harbor.md`): `tasks/<id>/` (and those that need
their own image, `image_tasks/<id>/`), once per process.

A folder is read into a `TerminalTask`: `instruction.md` is the prompt, `environment/workspace/` the files
set up in /workspace (with their executable bits), `tests/check.sh` the check (`tests/test.sh` is Harbor's
entry point around it, for the `harbor` env), `solution/turns.json` the tool calls the demo policy plays
(`solution/solve.sh` is the same as one script, for Harbor's own tools), and `[metadata] check_in_session`
says the check runs in the agent's stateful terminal. The `harbor` env runs the same folders in their images.
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path

from envs.harbor.task import HarborTaskError, load_task
from envs.terminal_tasks.model import TerminalTask

TASKS_DIR = Path(__file__).with_name("tasks")
IMAGE_TASKS_DIR = Path(__file__).with_name("image_tasks")
WORKSPACE_FILES = Path("environment") / "workspace"


def load_task_folder(folder: Path, *, own_image: bool = False) -> TerminalTask:
    """The task in the Harbor folder `folder`, checked as any Harbor task is, then as a terminal task.
    `own_image`: the task runs in the image `environment/` builds, not on the sandbox host's root."""
    try:
        harbor = load_task(folder)
    except HarborTaskError as err:
        raise ValueError(str(err)) from None
    files: dict[str, str] = {}
    executable = []
    workspace = folder / WORKSPACE_FILES
    for path in sorted(workspace.rglob("*")) if workspace.is_dir() else []:
        if path.is_symlink() or not path.is_file():
            continue
        relative = str(path.relative_to(workspace))
        files[relative] = path.read_text(encoding="utf-8")
        if os.access(path, os.X_OK):
            executable.append(relative)
    return TerminalTask(
        id=folder.name,
        prompt=harbor.instruction.rstrip("\n"),
        files=files,
        executable=tuple(executable),
        check=(folder / "tests" / "check.sh").read_text(encoding="utf-8"),
        check_in_session=bool(harbor.metadata.get("check_in_session", False)),
        solution=json.loads((folder / "solution" / "turns.json").read_text(encoding="utf-8")),
        context=str(harbor.environment) if own_image else None,
    )


def load_tasks_from(directory: Path, *, own_image: bool = False) -> dict[str, TerminalTask]:
    """Every task folder in `directory`, by id (its folder's name), in name order."""
    return {
        folder.name: load_task_folder(folder, own_image=own_image)
        for folder in sorted(directory.iterdir())
        if folder.is_dir() and (folder / "task.toml").is_file()
    }


@functools.cache
def bundled_tasks() -> dict[str, TerminalTask]:
    return load_tasks_from(TASKS_DIR)


@functools.cache
def bundled_image_tasks() -> dict[str, TerminalTask]:
    return load_tasks_from(IMAGE_TASKS_DIR, own_image=True)
