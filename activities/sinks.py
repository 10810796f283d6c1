"""Where finished groups go: a JSONL file of Atropos `ScoredDataGroup`s, and with
`sink: atropos` also Atropos' trajectory API (`run-api`), where a trainer pulls them.

A group is written only when every rollout in it was scored, at most once however the
write is retried (`temporal_rollouts.sinks.jsonl`). Posting is marked once run-api
accepted it; a post whose answer was lost is sent again (at least once: a lost group
wastes the rollouts, a repeated one only reweights it).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field
from temporalio import activity

from temporal_rollouts.core.errors import ConfigError, activity_boundary
from temporal_rollouts.core.forks import PrefixTokens
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.records import TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sinks.atropos_api import TrajectoryApi
from temporal_rollouts.sinks.groups import GroupBuilder
from temporal_rollouts.sinks.jsonl import POSTED, append_once, mark_locked, marked
from temporal_rollouts.sinks.templates import SftTemplates


class OpenSinkInput(BaseModel):
    batch_id: str
    output: str | None = None


class WriteGroupInput(BaseModel):
    path: str = Field(
        description="The JSONL file, inside this worker's results folder (a relative name, or an absolute path within it)."
    )
    group_id: str
    results: list[TrajectoryResult]
    sink: Literal["jsonl", "atropos"] = "jsonl"
    max_token_length: int = 0
    policy: str | None = Field(
        default=None, description="The batch's policy: a chat policy with a tokenizer renders SFT tokens."
    )
    prefix_tokens: PrefixTokens | None = Field(
        default=None, description="A tree's shared prefixes: trained once or in every branch."
    )


class WriteGroupResult(BaseModel):
    status: Literal["written", "already_written", "pending"]


class SinkActivities:
    def __init__(self, settings: Settings, groups: GroupBuilder) -> None:
        self._settings = settings
        self._groups = groups
        self._templates = SftTemplates(settings)

    @activity.defn(name="open_sink")
    @checked_input
    async def open_sink(self, input: OpenSinkInput) -> str:
        with activity_boundary():
            path = results_path(
                self._settings.results_dir,
                input.output or f"{input.batch_id}.jsonl",
                "output" if input.output else "batch id",
            )
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            except OSError as err:
                raise ConfigError(f"cannot write results to {path}: {err}") from err
            return str(path.resolve())

    @activity.defn(name="write_group")
    @checked_input
    async def write_group(self, input: WriteGroupInput) -> WriteGroupResult:
        """Write the group if every rollout in it was scored; else leave it pending for a resume."""
        if not input.results or any(r.failed for r in input.results):
            return WriteGroupResult(status="pending")
        with activity_boundary():
            path = results_path(self._settings.results_dir, input.path, "output")
            api = (
                TrajectoryApi(self._settings.atropos.api_url, self._settings.atropos.timeout_s)
                if input.sink == "atropos"
                else None
            )
            try:
                limit = input.max_token_length or (await _trainer_max_tokens(api) if api else 0)
                group = await self._groups.build(
                    input.group_id,
                    input.results,
                    max_token_length=limit,
                    sft_template=await self._templates.for_policy(input.policy),
                    prefix_tokens=input.prefix_tokens,
                )
                written = await asyncio.to_thread(append_once, path, input.group_id, group.model_dump_json())
                if api is not None and not await asyncio.to_thread(marked, path, POSTED, input.group_id):
                    await api.post_group(group.for_api())
                    await asyncio.to_thread(mark_locked, path, POSTED, input.group_id)
            finally:
                if api is not None:
                    await api.aclose()
            return WriteGroupResult(status="written" if written else "already_written")


def results_path(results_dir: Path, name: str, field: str) -> Path:
    """`name` resolved inside the results folder (relative names are relative to it); a path that
    leads anywhere else (absolute elsewhere, `..`, a symlink out) is refused, naming the field."""
    root = results_dir.resolve()
    path = (root / name).resolve()
    if not path.is_relative_to(root) or path == root:
        raise ConfigError(f"{field}: {name!r} is outside the results folder {root}; give a file name inside it")
    return path


async def _trainer_max_tokens(api: TrajectoryApi) -> int:
    """Below the registered trainer's limit (Atropos drops sequences that reach it);
    -1 (no trainer yet) means no cut."""
    return max(0, int((await api.trainer_info()).get("max_token_len", -1)) - 1)
