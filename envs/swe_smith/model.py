"""One SWE-smith instance, in the dataset's own field names.

SWE-smith and SWE-smith-oracle store `FAIL_TO_PASS` and `PASS_TO_PASS` either as lists or as
JSON text of a list (the Hugging Face export does the latter); both are accepted. Fields the
env does not use (`image_name`, `created_at`, our `mutation`...) are kept as they came.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

REPO_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)?$")
COMMIT = re.compile(r"^[0-9a-f]{7,64}$")


class SweInstance(BaseModel):
    """A bug to fix: the repository at `base_commit`, and the tests that decide."""

    model_config = ConfigDict(frozen=True, extra="allow")

    instance_id: str = Field(min_length=1)
    repo: str = Field(description="Repository name, `owner/name` or a bare name; joined to repo_base_url.")
    base_commit: str = Field(description="Commit the workspace starts from (the buggy one).")
    problem_statement: str
    FAIL_TO_PASS: list[str] = Field(description="Test ids that fail at base_commit and must pass.")
    PASS_TO_PASS: list[str] = Field(default_factory=list, description="Test ids that must keep passing.")
    patch: str | None = Field(default=None, description="Reference fix, a unified diff against base_commit.")
    text: str | None = Field(
        default=None,
        description="Oracle context added by prompt_mode problem_statement+text.",
    )
    created_at: str | None = None
    image_name: str | None = None

    @field_validator("FAIL_TO_PASS", "PASS_TO_PASS", mode="before")
    @classmethod
    def _json_lists(cls, value: Any) -> Any:
        if isinstance(value, str):
            return json.loads(value) if value.strip() else []
        return value

    @field_validator("repo")
    @classmethod
    def _repo_name(cls, value: str) -> str:
        if not REPO_NAME.match(value) or ".." in value:
            raise ValueError(f"repo {value!r} is not `owner/name` or `name`")
        return value

    @field_validator("base_commit")
    @classmethod
    def _commit(cls, value: str) -> str:
        if not COMMIT.match(value):
            raise ValueError(f"base_commit {value!r} is not a hexadecimal commit id")
        return value

    @property
    def python_only(self) -> bool:
        """Every test id names a Python file, as the original's `python_only` filter requires."""
        return all(".py::" in nodeid for nodeid in (*self.FAIL_TO_PASS, *self.PASS_TO_PASS))

    @property
    def checkout_name(self) -> str:
        """The folder under /workspace the repository is checked out into."""
        return self.repo.rsplit("/", 1)[-1].split("__")[-1]
