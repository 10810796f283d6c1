"""Where finished groups go: a JSONL file of Atropos `ScoredDataGroup`s, and with
`sink: atropos` also Atropos' trajectory API (`run-api`), where a trainer pulls them.

A group is written only when every rollout in it was scored. Appends are guarded by a
file lock and an index of written group ids, so a retried write, two workers, or a
batch gathering again after a resume never write a group twice. Posting is marked in
a second index once run-api accepted it; a post whose answer was lost is sent again
(at least once: a lost group wastes the rollouts, a repeated one only reweights it).
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel
from temporalio import activity

from integrations.atropos.api import TrajectoryApi
from rollouts.errors import ConfigError, activity_boundary
from rollouts.groups import GroupBuilder
from rollouts.records import TrajectoryResult
from rollouts.settings import Settings


class OpenSinkInput(BaseModel):
    batch_id: str
    output: str | None = None


class WriteGroupInput(BaseModel):
    path: str
    group_id: str
    results: list[TrajectoryResult]
    sink: Literal["jsonl", "atropos"] = "jsonl"
    max_token_length: int = 0


class WriteGroupResult(BaseModel):
    status: Literal["written", "already_written", "pending"]


class SinkActivities:
    def __init__(self, settings: Settings, groups: GroupBuilder) -> None:
        self._settings = settings
        self._groups = groups

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
        with activity_boundary():
            api = TrajectoryApi(self._settings.atropos.api_url, self._settings.atropos.timeout_s) if input.sink == "atropos" else None
            try:
                limit = input.max_token_length or (await _trainer_max_tokens(api) if api else 0)
                group = await self._groups.build(input.group_id, input.results, max_token_length=limit)
                path = Path(input.path)
                written = await asyncio.to_thread(append_once, path, input.group_id, group.model_dump_json())
                if api is not None and not await asyncio.to_thread(_marked, path, POSTED, input.group_id):
                    await api.post_group(group.for_api())
                    await asyncio.to_thread(_mark_locked, path, POSTED, input.group_id)
            finally:
                if api is not None:
                    await api.aclose()
            return WriteGroupResult(status="written" if written else "already_written")


async def _trainer_max_tokens(api: TrajectoryApi) -> int:
    """Below the registered trainer's limit (Atropos drops sequences that reach it);
    -1 (no trainer yet) means no cut."""
    return max(0, int((await api.trainer_info()).get("max_token_len", -1)) - 1)


INDEX, POSTED = ".index", ".posted"


def _beside(path: Path, suffix: str) -> Path:
    return path.with_name(path.name + suffix)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """The file lock every writer of `path` and its indexes holds (workers, retries)."""
    with open(_beside(path, ".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def _marked(path: Path, suffix: str, key: str) -> bool:
    marks = _beside(path, suffix)
    return marks.exists() and key in marks.read_text().split()


def _mark(path: Path, suffix: str, key: str) -> None:
    with open(_beside(path, suffix), "a") as marks:
        marks.write(key + "\n")


def _mark_locked(path: Path, suffix: str, key: str) -> None:
    with _locked(path):
        _mark(path, suffix, key)


def append_once(path: Path, key: str, line: str) -> bool:
    """Append `line` unless `key` was appended before; True when written."""
    with _locked(path):
        if _marked(path, INDEX, key):
            return False
        with open(path, "a") as out:
            out.write(line + "\n")
            out.flush()
            os.fsync(out.fileno())
        _mark(path, INDEX, key)
        return True


def read_groups(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
