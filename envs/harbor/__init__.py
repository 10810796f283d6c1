"""Harbor task folders (`task.toml`, `instruction.md`, `environment/`, `tests/`, `solution/`) as a dataset."""

from envs.harbor.env import HarborEnv
from envs.harbor.task import HarborTask, HarborTaskError, load_task, task_folders

__all__ = ["HarborEnv", "HarborTask", "HarborTaskError", "load_task", "task_folders"]
