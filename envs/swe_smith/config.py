"""The `swe_smith` env's config: the original SweSmithOracleEnvConfig's names and defaults,
plus where the instances and repositories come from when no hub or GitHub is reachable."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

DATA_DIR = Path(__file__).with_name("data")
SHIPPED_INSTANCES = DATA_DIR / "instances.jsonl"
SHIPPED_REPOS = DATA_DIR / "repos"
SHIPPED_WHEELS = DATA_DIR / "wheels"


class SweSmithConfig(BaseModel):
    """Every key an `env_config` of `swe_smith` may hold; an unknown key is an error."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    dataset: str = Field(
        default=str(SHIPPED_INSTANCES),
        description="A .jsonl or .parquet file of SWE-smith instances.",
    )
    python_only: bool = Field(
        default=True,
        description="Keep only instances whose test ids all name a .py file.",
    )
    shuffle: bool = Field(
        default=True,
        description="Shuffle the instances (by `seed`) before cycling through them.",
    )
    seed: int = Field(default=0, description="Seed of the shuffle.")
    max_items: int = Field(
        default=0,
        ge=0,
        description="Use only the first N instances (after shuffling); 0 = all.",
    )
    prompt_mode: Literal["problem_statement", "problem_statement+text"] = Field(
        default="problem_statement",
        description="What the user message holds: the problem, or the problem and `text`.",
    )
    repo_base_url: str = Field(
        default=str(SHIPPED_REPOS),
        description="Where `repo` is found: a local folder of `<repo>.bundle` files or git repositories, or a "
        "git URL prefix such as https://github.com (the slot then fetches with the network on).",
    )
    wheelhouse: str = Field(
        default=str(SHIPPED_WHEELS),
        description="Folder of wheels the grader installs pytest from.",
    )
    install_timeout_s: float = Field(
        default=600.0,
        gt=0,
        le=600,
        description="Timeout of the venv and `pip install -e .`.",
    )
    test_timeout_s: float = Field(default=600.0, gt=0, le=600, description="Timeout of each pytest chunk.")
    test_chunk_size: int = Field(
        default=50,
        gt=0,
        le=200,
        description="Test ids per pytest run, as the original (at most 200: one run's results must fit the output cap).",
    )
    score_include_fail_to_pass: bool = Field(
        default=True, description="Grade FAIL_TO_PASS too, not PASS_TO_PASS alone."
    )
    reward: Literal["binary", "shaped"] = Field(
        default="binary",
        description="1.0 iff the tests pass, or the original's cold-start shaping (see grading).",
    )
    tools: list[str] | None = Field(
        default=None,
        description="Tool names offered to the model (every env takes it).",
    )
    system_prompt: str | None = Field(
        default=None,
        description="Replaces the env's system prompt (every env takes it).",
    )

    @field_validator("dataset")
    @classmethod
    def _dataset_file(cls, value: str) -> str:
        if not value.endswith((".jsonl", ".json", ".parquet")):
            raise ValueError(
                f"dataset {value!r} must be a .jsonl or .parquet file (a Hugging Face hub is not reachable here; "
                "export the dataset to a file first)"
            )
        return value

    @property
    def repos_are_remote(self) -> bool:
        return "://" in self.repo_base_url
