"""An agent harness that runs in the slot instead of our own loop: what a batch or an env names, and what
a rollout keeps of it.

A harness is a command run with bash in the slot's workspace, as the agent. It finds a model
endpoint for this rollout alone at `$OPENAI_BASE_URL` (with `$OPENAI_API_KEY`), its task in the file
`$ROLLOUTS_TASK_FILE`, and the model's name in `$ROLLOUTS_MODEL`. Each request it sends there is a
model-turn step of the rollout's workflow (workflows/harness_loop.py). Its Python packages, when it
names `requirements`, are built once by the worker into a bundle that the slot's container keeps in
its read-only cache; the command sees the bundle at `$ROLLOUTS_HARNESS_HOME`, on `PYTHONPATH` and, with
its `bin/`, on `PATH`. Two harnesses are named here: `minimal` (ours, the openai client plus a bash
tool: temporal_rollouts/harnesses/minimal.py) and `mini-swe-agent` (from PyPI, as it is).
"""

from __future__ import annotations

import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from temporal_rollouts.sandbox_server.schema import HARNESS_TAIL_CHARS, HarnessExit

__all__ = ["HARNESSES", "HARNESS_TAIL_CHARS", "HarnessExit", "HarnessRecord", "HarnessSpec", "named_harness"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,127}$")
RESERVED_ENV_PREFIXES = ("OPENAI_", "ROLLOUTS_")
"""Variables the sandbox server sets for the harness; a spec may not set them itself."""


class HarnessSpec(BaseModel):
    """What to run as the agent. Its values travel in the workflow's history: no secrets."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="custom", max_length=64, description="A name for people reading the rollout.")
    command: str = Field(min_length=1, max_length=8192, description="Run with bash in /workspace, as the agent.")
    requirements: list[str] = Field(
        default_factory=list, description="pip requirements of the harness's bundle (built by the worker)."
    )
    exclude: list[str] = Field(
        default_factory=list,
        description="Distributions of the resolved requirements left out of the bundle (ones the harness never "
        "imports, e.g. mini-swe-agent's `datasets`).",
    )
    modules: list[str] = Field(
        default_factory=list,
        description="Python modules of installed packages copied into the bundle, their packages reduced to "
        "empty __init__ files (a harness that is one module of a package, like ours).",
    )
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for the command.")

    @field_validator("env")
    @classmethod
    def _names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not _ENV_NAME.match(name):
                raise ValueError(f"{name!r} is not an environment variable name")
            if name.startswith(RESERVED_ENV_PREFIXES):
                raise ValueError(
                    f"{name}: variables starting with {' or '.join(RESERVED_ENV_PREFIXES)} are set for the harness"
                )
        return env

    @property
    def bundled(self) -> bool:
        return bool(self.requirements or self.modules)


class HarnessRecord(BaseModel):
    """What a rollout keeps of its harness: which one, its calls, and how it ended."""

    spec: HarnessSpec
    calls: int = Field(default=0, description="Model calls the harness made (each a model-turn step).")
    rewrites: int = Field(
        default=0, description="Calls whose messages did not extend the conversation so far (a new sequence)."
    )
    starts: int = Field(default=0, description="Times the harness was started: more than 1 after a resume.")
    exit: HarnessExit | None = None


MINIMAL = HarnessSpec(
    name="minimal",
    command="python3 -m temporal_rollouts.harnesses.minimal",
    requirements=["openai>=1.40"],
    modules=["temporal_rollouts.harnesses.minimal"],
)
MINI_SWE_AGENT = HarnessSpec(
    name="mini-swe-agent",
    command=(
        'python3 -m minisweagent.run.mini --model "openai/$ROLLOUTS_MODEL" --task "$(cat "$ROLLOUTS_TASK_FILE")" '
        "--yolo --exit-immediately --cost-limit 0 --output /tmp/mini-swe-agent/trajectory.json"
    ),
    requirements=["mini-swe-agent==2.4.6"],
    exclude=["datasets", "pandas", "pyarrow", "numpy", "textual"],
    env={
        "MSWEA_CONFIGURED": "true",
        "MSWEA_SILENT_STARTUP": "1",
        "MSWEA_COST_TRACKING": "ignore_errors",
        "MSWEA_GLOBAL_CONFIG_DIR": "/tmp/mini-swe-agent",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    },
)
HARNESSES = {spec.name: spec for spec in (MINIMAL, MINI_SWE_AGENT)}


def named_harness(value: str | HarnessSpec | dict | None) -> HarnessSpec | None:
    """A harness as a batch names it: one of HARNESSES by name, or a spec of its own."""
    if value is None or isinstance(value, HarnessSpec):
        return value
    if isinstance(value, dict):
        return HarnessSpec.model_validate(value)
    if value not in HARNESSES:
        raise ValueError(f"unknown harness {value!r}: name one of {', '.join(sorted(HARNESSES))}, or give a spec")
    return HARNESSES[value]
