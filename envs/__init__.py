"""Task families (envs). Importing this package registers every bundled env."""

from envs import echo_chain, harbor, swe_smith, terminal_tasks, write_word  # noqa: F401  (importing registers them)
from envs.registry import env_names, get_env, register_env

__all__ = ["env_names", "get_env", "register_env"]
