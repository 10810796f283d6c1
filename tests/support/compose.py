"""The compose file as data, and the Compose specification's JSON schema to check it against.

The schema is not committed here: it is read from the `compose/config/compose_spec.json` that
the docker-compose 1.29.2 wheel ships, found installed, else in a wheel under
`~/.cache/rollouts-tests`, else fetched there with `pip download --no-deps` (the package index
only; the wheel is never installed). Its spec predates some newer keys, none of which we use.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO

COMPOSE_FILE = REPO / "docker-compose.yml"
SPEC_WHEEL = "docker-compose==1.29.2"
SPEC_MEMBER = "compose/config/compose_spec.json"
CACHE = Path.home() / ".cache" / "rollouts-tests" / "docker-compose-wheel"


def load_compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def compose_spec_schema() -> dict[str, Any] | None:
    """The schema, or None when neither an installed package nor the package index has it."""
    found = importlib.util.find_spec("compose")
    if found is not None and found.submodule_search_locations:
        for folder in found.submodule_search_locations:
            path = Path(folder) / "config" / "compose_spec.json"
            if path.is_file():
                return json.loads(path.read_text())
    wheels = sorted(CACHE.glob("docker_compose-1.29.2-*.whl"))
    if not wheels:
        CACHE.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(CACHE), SPEC_WHEEL],
            capture_output=True,
            timeout=120,
        )
        wheels = sorted(CACHE.glob("docker_compose-1.29.2-*.whl"))
    if not wheels:
        return None
    with zipfile.ZipFile(wheels[0]) as wheel:
        return json.loads(wheel.read(SPEC_MEMBER))
