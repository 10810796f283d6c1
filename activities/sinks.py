"""Where finished groups go: a JSONL file of Atropos `ScoredDataGroup`s.

A group is written only when every rollout in it was scored. Appends are guarded by a
file lock and an index of written group ids, so a retried write, two workers, or a
batch gathering again after a resume never write a group twice.
"""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
from collections import Counter
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio import activity

from rollouts.errors import ConfigError, activity_boundary
from rollouts.messages import Message
from rollouts.records import TrajectoryResult
from rollouts.settings import Settings
from storage.transcripts import TranscriptStore


class ScoredGroup(BaseModel):
    """The fields of atroposlib's `ScoredDataGroup`, plus our own `metadata`."""

    tokens: list[list[int]] = Field(default_factory=list)
    masks: list[list[int]] = Field(default_factory=list)
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    group_overrides: dict[str, Any] | None = None
    overrides: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)


def build_group(group_id: str, results: list[TrajectoryResult], transcripts: list[list[Message]]) -> ScoredGroup:
    """One item's group from its scored rollouts and their transcripts."""
    tool_errors = [e for r in results for e in r.tool_errors]
    return ScoredGroup(
        tokens=[[] for _ in results],
        masks=[[] for _ in results],
        scores=[r.score for r in results],
        messages=[[m.to_openai() for m in transcript] for transcript in transcripts],
        overrides=[{"rollout_id": r.rollout_id, "stop_reason": r.stop_reason.value} for r in results],
        metadata={
            "group_id": group_id,
            "env": results[0].env,
            "item_id": results[0].item_id,
            "rollout_ids": [r.rollout_id for r in results],
            "stop_reasons": [r.stop_reason.value for r in results],
            "resumed_rollouts": [r.rollout_id for r in results if r.resumed_from_run],
            "tool_errors": {
                "count": len(tool_errors),
                "by_tool": dict(Counter(e.tool_name for e in tool_errors)),
                "errors": [e.model_dump() for e in tool_errors[:50]],
            },
        },
    )


class OpenSinkInput(BaseModel):
    batch_id: str
    output: str | None = None


class WriteGroupInput(BaseModel):
    path: str
    group_id: str
    results: list[TrajectoryResult]


class WriteGroupResult(BaseModel):
    status: Literal["written", "already_written", "pending"]


class SinkActivities:
    def __init__(self, settings: Settings, transcripts: TranscriptStore) -> None:
        self._settings = settings
        self._transcripts = transcripts

    @activity.defn(name="open_sink")
    async def open_sink(self, input: OpenSinkInput) -> str:
        with activity_boundary():
            path = Path(input.output) if input.output else self._settings.results_dir / f"{input.batch_id}.jsonl"
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.touch()
            except OSError as err:
                raise ConfigError(f"cannot write results to {path}: {err}") from err
            return str(path.resolve())

    @activity.defn(name="write_group")
    async def write_group(self, input: WriteGroupInput) -> WriteGroupResult:
        """Write the group if every rollout in it was scored; else leave it pending for a resume."""
        if not input.results or any(r.failed for r in input.results):
            return WriteGroupResult(status="pending")
        transcripts = [await self._transcripts.load(r.transcript) if r.transcript else [] for r in input.results]
        line = build_group(input.group_id, input.results, transcripts).model_dump_json()
        written = await asyncio.to_thread(append_once, Path(input.path), input.group_id, line)
        return WriteGroupResult(status="written" if written else "already_written")


def append_once(path: Path, key: str, line: str) -> bool:
    """Append `line` unless `key` was appended before; True when written."""
    index = path.with_name(path.name + ".index")
    with open(path.with_name(path.name + ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = set(index.read_text().split()) if index.exists() else set()
        if key in done:
            return False
        with open(path, "a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        with open(index, "a") as idx:
            idx.write(key + "\n")
        return True


def read_groups(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
