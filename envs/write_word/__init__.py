"""A task a 135M model can learn on CPU in tens of RL steps: one well-formed tool call."""

from envs.write_word.env import WriteWordEnv
from envs.write_word.tasks import WriteWordTask, all_tasks

__all__ = ["WriteWordEnv", "WriteWordTask", "all_tasks"]
