"""SWE-smith tasks: fix an injected bug in a real Python project until its failing tests pass."""

from envs.swe_smith.env import SYSTEM_PROMPT, SweSmithEnv
from envs.swe_smith.model import SweInstance

__all__ = ["SYSTEM_PROMPT", "SweInstance", "SweSmithEnv"]
