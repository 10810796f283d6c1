"""Loading the settings for a command or a worker, with errors that name the file and the key.

`Settings()` itself turns a bad key or value into a ConfigError naming the key and where it
came from (core/settings.py); TOML that does not parse is named here.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings, config_file, is_file_module

ENV_MODULES_VARIABLE = "ROLLOUTS_ENV_MODULES"


def load_settings(**overrides) -> Settings:
    path = config_file()
    try:
        return Settings(**overrides)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None


def with_env_modules(settings: Settings, modules: Sequence[str] | None) -> Settings:
    """The settings with `modules` (given as `--env-module`) added to `env_modules`, and the whole list exported
    as ROLLOUTS_ENV_MODULES, so the processes this one starts (more workers, the demo policy) load the same."""
    if not modules:
        return settings
    added = [str(Path(m).resolve()) if is_file_module(m) else m for m in modules]
    merged = list(dict.fromkeys([*settings.env_modules, *added]))
    os.environ[ENV_MODULES_VARIABLE] = ",".join(merged)
    return settings.model_copy(update={"env_modules": merged})
