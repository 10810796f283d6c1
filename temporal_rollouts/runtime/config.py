"""Loading the settings for a command or a worker, with errors that name the file and the key.

`Settings()` raises pydantic's validation error, whose text is a multi-line report without
the file it came from; a typo in rollouts.toml then reads like a crash. Here it becomes a
ConfigError such as `rollouts.toml: unknown key 'sandbox.slots_per_containr'`.
"""

from __future__ import annotations

import tomllib

from pydantic import ValidationError

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings, config_file


def load_settings(**overrides) -> Settings:
    path = config_file()
    where = str(path) if path else "the ROLLOUTS_ environment variables"
    try:
        return Settings(**overrides)
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: not valid TOML: {err}") from None
    except ValidationError as err:
        problems = []
        for problem in err.errors()[:3]:
            key = ".".join(str(part) for part in problem["loc"])
            if problem["type"] == "extra_forbidden":
                problems.append(f"unknown key {key!r}")
            else:
                problems.append(f"{key}: {problem['msg']} (got {problem.get('input')!r})")
        more = f" (and {err.error_count() - 3} more)" if err.error_count() > 3 else ""
        raise ConfigError(f"{where}: " + "; ".join(problems) + more) from None
