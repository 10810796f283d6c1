"""Reads SWE-smith instances from a JSONL or Parquet file and picks the ones a config asks for.

Files are read once per process (by path and modification time); the instance order after
`python_only`, `shuffle`/`seed` and `max_items` is what `load_items` cycles through.
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

from pydantic import ValidationError

from envs.swe_smith.config import SweSmithConfig
from envs.swe_smith.model import SweInstance
from temporal_rollouts.core.errors import ConfigError


def read_instances(path: str | Path) -> dict[str, SweInstance]:
    """Every instance of the file by id; a malformed row is a `ConfigError` naming its line."""
    path = Path(path)
    try:
        stamp = path.stat().st_mtime_ns
    except OSError as exc:
        raise ConfigError(f"swe_smith dataset {str(path)!r} cannot be read: {exc}") from None
    return _read(str(path), stamp)


@functools.lru_cache(maxsize=8)
def _read(path: str, _stamp: int) -> dict[str, SweInstance]:
    rows = _parquet_rows(path) if path.endswith(".parquet") else _jsonl_rows(path)
    instances: dict[str, SweInstance] = {}
    for number, row in rows:
        try:
            instance = SweInstance.model_validate(row)
        except ValidationError as exc:
            raise ConfigError(f"{path}, row {number}: not a SWE-smith instance: {exc}") from None
        if instance.instance_id in instances:
            raise ConfigError(f"{path}, row {number}: instance_id {instance.instance_id!r} appears twice")
        instances[instance.instance_id] = instance
    return instances


def _jsonl_rows(path: str) -> list[tuple[int, dict]]:
    rows = []
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, start=1):
            if line.strip():
                try:
                    rows.append((number, json.loads(line)))
                except ValueError as exc:
                    raise ConfigError(f"{path}, line {number}: not JSON: {exc}") from None
    return rows


def _parquet_rows(path: str) -> list[tuple[int, dict]]:
    try:
        from pyarrow import parquet
    except ImportError:
        raise ConfigError(
            f"{path}: reading Parquet needs pyarrow (pip install pyarrow), or use a .jsonl file"
        ) from None
    table = parquet.read_table(path)
    return list(enumerate(table.to_pylist(), start=1))


def selected_ids(config: SweSmithConfig) -> list[str]:
    """Instance ids in the order the env hands them out."""
    instances = read_instances(config.dataset)
    ids = [i for i, instance in instances.items() if instance.python_only or not config.python_only]
    if config.shuffle:
        random.Random(config.seed).shuffle(ids)
    if config.max_items:
        ids = ids[: config.max_items]
    return ids
