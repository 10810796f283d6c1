"""Small shell tasks (files, scripts, data wrangling) checked by a bash script in the sandbox."""

from envs.terminal_tasks.env import SYSTEM_PROMPT, TerminalTasksEnv
from envs.terminal_tasks.loader import bundled_tasks, load_tasks_from
from envs.terminal_tasks.model import TerminalTask

__all__ = ["SYSTEM_PROMPT", "TerminalTask", "TerminalTasksEnv", "bundled_tasks", "load_tasks_from"]
