"""Env hooks return free-form data (setup metadata, verifier details) that travels through
Temporal. Past a megabyte it is refused with an explanation, never retried: the same
data would fail the same way on every attempt."""

from __future__ import annotations

import json
from typing import Any

from rollouts.errors import PayloadTooLarge

MAX_ENV_DATA_BYTES = 1024 * 1024


def ensure_small(what: str, value: dict[str, Any], limit: int = MAX_ENV_DATA_BYTES) -> dict[str, Any]:
    size = len(json.dumps(value, default=str).encode())
    if size > limit:
        raise PayloadTooLarge(
            f"{what} is {size} bytes, over the {limit}-byte limit for data that travels through Temporal; "
            "keep large artefacts in the workspace and return a summary"
        )
    return value
