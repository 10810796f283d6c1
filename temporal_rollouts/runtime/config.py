"""Loading the settings for a command or a worker, with errors that name the file and the key.

`Settings()` itself turns a bad key or value into a ConfigError naming the key and where it
came from (core/settings.py); TOML that does not parse is named here.
"""

from __future__ import annotations

import tomllib

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings, config_file


def load_settings(**overrides) -> Settings:
    path = config_file()
    try:
        return Settings(**overrides)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
