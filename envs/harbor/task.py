"""A Harbor task folder, read and checked: `task.toml`, `instruction.md`, `environment/`, `tests/`, `solution/`.

The format is Harbor's (harborframework.com): this module reads it as Harbor writes it and says, per task,
what this project does not honour. Fields it honours:

- `[agent] timeout_sec` and `[verifier] timeout_sec` (600 s when unset): the rollout's own timeouts,
  narrower than the batch's, never wider;
- `[verifier] env` (literal values only) and `environment_mode` (`shared`: the tests see the root the agent
  changed; anything else: the image as built, with the agent's working folder, `docs/harbor.md`);
- `[environment] build_timeout_sec` (600 s), `docker_image` (a prebuilt image instead of the build),
  `os` (`linux` only), `cpus`, `memory_mb` / `memory`, `storage_mb` / `storage`: the slot's limits,
  narrower than the sandbox server's; `network_mode` / `allow_internet`: whether the task asks for a network;
- `[metadata]`, `[task]`, `version`, `schema_version`, `source`: kept, not interpreted.

Every other field is a note: reported once per task (the CLI prints it, the worker logs it, the verdict
carries it), never ignored in silence. A task this project cannot run as its author meant (several steps,
GPUs, another OS) is refused with the reason.
"""

from __future__ import annotations

import math
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporal_rollouts.sandbox.images.dockerfile import base_images

TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
DEFAULT_VERIFIER_TIMEOUT_S = 600.0
DEFAULT_BUILD_TIMEOUT_S = 600.0
MAX_INSTRUCTION_BYTES = 256 * 1024
MAX_TESTS_BYTES = 64 * 1024 * 1024
"""Tests and solution travel to the sandbox's cache as one archive each; a folder larger than this is refused."""

_KEPT_TOP = {"version", "schema_version", "metadata", "task", "source", "verifier", "agent", "environment", "solution"}
_VERIFIER = {"timeout_sec", "env", "environment_mode"}
_AGENT = {"timeout_sec"}
_ENVIRONMENT = {
    "build_timeout_sec",
    "docker_image",
    "os",
    "cpus",
    "memory_mb",
    "memory",
    "storage_mb",
    "storage",
    "network_mode",
    "allow_internet",
    "gpus",
}
_SECONDS = " of seconds"
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GMK])\s*$", re.IGNORECASE)


class HarborTaskError(ValueError):
    """A task folder that cannot run: the message names the folder and the field."""


@dataclass(frozen=True)
class HarborTask:
    name: str
    folder: Path
    instruction: str
    agent_timeout_s: float | None
    verifier_timeout_s: float
    build_timeout_s: float
    docker_image: str | None
    cpus: float | None
    memory_mb: float | None
    storage_mb: float | None
    wants_internet: bool
    verifier_env: dict[str, str]
    shared_verifier: bool
    notes: tuple[str, ...] = field(default=())
    """Fields this project does not honour, one line each."""
    metadata: dict[str, Any] = field(default_factory=dict)
    """`[metadata]` as the task gives it: kept, not interpreted here (an env may read its own keys)."""

    @property
    def environment(self) -> Path:
        return self.folder / "environment"

    @property
    def tests(self) -> Path:
        return self.folder / "tests"

    @property
    def solution(self) -> Path:
        return self.folder / "solution"

    def limits(self) -> dict[str, float]:
        """The slot's limits the task names, by sandbox settings name (the server keeps the narrower)."""
        named = {"cpus": self.cpus, "memory_limit_mb": self.memory_mb, "disk_limit_mb": self.storage_mb}
        return {name: value for name, value in named.items() if value is not None}


def is_task_folder(path: Path) -> bool:
    return (path / TASK_FILE).is_file()


def task_folders(path: Path) -> list[Path]:
    """The task folders at `path`: itself when it is one, else its subfolders that are, by name."""
    if not path.is_dir():
        raise HarborTaskError(f"{path}: no such folder")
    if is_task_folder(path):
        return [path]
    folders = sorted(child for child in path.iterdir() if child.is_dir() and is_task_folder(child))
    if not folders:
        raise HarborTaskError(f"{path}: neither a Harbor task folder (no {TASK_FILE}) nor a folder of them")
    return folders


def load_task(folder: Path) -> HarborTask:
    """The task in `folder`, checked; HarborTaskError names the file and field that is wrong."""
    where = folder / TASK_FILE
    try:
        config = tomllib.loads(where.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise HarborTaskError(f"{where}: cannot be read: {err}") from None
    notes: list[str] = []

    def fail(what: str) -> HarborTaskError:
        return HarborTaskError(f"{where}: {what}")

    def section(name: str, known: set[str]) -> dict[str, Any]:
        value = config.get(name, {})
        if not isinstance(value, dict):
            raise fail(f"[{name}] must be a table")
        for key in sorted(set(value) - known):
            notes.append(f"[{name}] {key} is not supported here and is ignored")
        return value

    for key in sorted(set(config) - _KEPT_TOP):
        if key == "steps":
            raise fail("multi-step tasks (`steps`) are not supported: run each step as a task of its own")
        notes.append(f"{key} is not supported here and is ignored")
    verifier, agent = section("verifier", _VERIFIER), section("agent", _AGENT)
    environment = section("environment", _ENVIRONMENT)
    solution = config.get("solution", {})
    if isinstance(solution, dict) and solution.get("env"):
        notes.append("[solution] env is not supported here and is ignored")

    os_name = str(environment.get("os", "linux")).lower()
    if os_name != "linux":
        raise fail(f"[environment] os = {os_name!r}: only linux tasks run here")
    if (gpus := environment.get("gpus")) not in (None, 0):
        raise fail(f"[environment] gpus = {gpus!r}: slots have no GPUs")
    docker_image = environment.get("docker_image")
    if docker_image is not None and (not isinstance(docker_image, str) or not docker_image.strip()):
        raise fail("[environment] docker_image must be an image reference")
    if docker_image is None:
        _check_dockerfile(folder / "environment" / "Dockerfile", fail)
    metadata = config.get("metadata", {})
    if not isinstance(metadata, dict):
        raise fail("[metadata] must be a table")
    mode = verifier.get("environment_mode")
    if mode not in (None, "shared", "separate"):
        raise fail(f"[verifier] environment_mode must be 'shared' or 'separate', not {mode!r}")
    return HarborTask(
        name=folder.name,
        folder=folder.resolve(),
        instruction=_instruction(folder, fail),
        agent_timeout_s=_positive(agent, "timeout_sec", "agent", fail, _SECONDS),
        verifier_timeout_s=_positive(verifier, "timeout_sec", "verifier", fail, _SECONDS) or DEFAULT_VERIFIER_TIMEOUT_S,
        build_timeout_s=_positive(environment, "build_timeout_sec", "environment", fail, _SECONDS)
        or DEFAULT_BUILD_TIMEOUT_S,
        docker_image=docker_image,
        cpus=_positive(environment, "cpus", "environment", fail),
        memory_mb=_megabytes(environment, "memory", fail),
        storage_mb=_megabytes(environment, "storage", fail),
        wants_internet=_wants_internet(environment, fail),
        verifier_env=_verifier_env(verifier, notes, fail),
        shared_verifier=mode == "shared",
        notes=tuple(notes),
        metadata=metadata,
    )


def _check_dockerfile(path: Path, fail: Any) -> None:
    """The task's Dockerfile exists and starts from an image. Whether that base can be had is the build's
    to say (`image_build_failed`, naming it): a Modal worker pulls from registries a local one cannot reach."""
    if not path.is_file():
        raise fail("no environment/Dockerfile and no [environment] docker_image: the task has no image")
    try:
        base_images(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise fail(f"environment/Dockerfile: {err}") from None


def _instruction(folder: Path, fail: Any) -> str:
    path = folder / INSTRUCTION_FILE
    if not (folder / "tests" / "test.sh").is_file():
        raise fail("no tests/test.sh: the task cannot be verified")
    try:
        if path.stat().st_size > MAX_INSTRUCTION_BYTES:
            raise fail(f"{INSTRUCTION_FILE} is over {MAX_INSTRUCTION_BYTES} bytes")
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise fail(f"{INSTRUCTION_FILE} cannot be read: {err}") from None
    if not text.strip():
        raise fail(f"{INSTRUCTION_FILE} is empty")
    return text


def _positive(table: dict[str, Any], name: str, section: str, fail: Any, unit: str = "") -> float | None:
    """`[section] name`, a finite positive number (`unit` names what it counts in the refusal), or None."""
    value = table.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise fail(f"[{section}] {name} must be a positive number{unit}, not {value!r}")
    return float(value)


def _megabytes(table: dict[str, Any], name: str, fail: Any) -> float | None:
    """`<name>_mb`, or the older `<name>` as "2G"/"512M"; both must agree when both are set."""
    exact = _positive(table, f"{name}_mb", "environment", fail)
    older = table.get(name)
    if older is None:
        return exact
    match = _SIZE.match(older) if isinstance(older, str) else None
    if match is None:
        raise fail(f"[environment] {name} = {older!r}: expected a size like '2G' or '512M'")
    size = float(match.group(1)) * {"G": 1024, "M": 1, "K": 1 / 1024}[match.group(2).upper()]
    if exact is not None and exact != size:
        raise fail(f"[environment] {name} = {older!r} and {name}_mb = {exact:g} disagree")
    if size <= 0:
        raise fail(f"[environment] {name} must be positive")
    return size


def _wants_internet(environment: dict[str, Any], fail: Any) -> bool:
    """Harbor's default is a public network; `no-network` or `allow_internet = false` says none.
    An allowlist cannot be enforced by a slot, so it asks for the network it names as for none."""
    mode = environment.get("network_mode")
    allow = environment.get("allow_internet")
    if allow is not None and not isinstance(allow, bool):
        raise fail(f"[environment] allow_internet must be true or false, not {allow!r}")
    if mode is None:
        return True if allow is None else allow
    if mode not in ("no-network", "public", "allowlist"):
        raise fail(f"[environment] network_mode must be no-network, public or allowlist, not {mode!r}")
    return mode == "public"


def _verifier_env(verifier: dict[str, Any], notes: list[str], fail: Any) -> dict[str, str]:
    """The verifier's variables, literal values only: a `${VAR}` Harbor would take from the host is never
    filled from the worker's environment (no secret of the worker enters a slot); it is left out, noted."""
    env = verifier.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise fail("[verifier] env must be a table of strings")
    kept = {}
    for name, value in env.items():
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            raise fail(f"[verifier] env: {name!r} is not a variable name")
        if "${" in value:
            notes.append(f"[verifier] env {name} names a host variable; none is passed into a slot, so it is unset")
        else:
            kept[name] = value
    return kept
