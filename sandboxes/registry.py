"""The file that lists the sandbox containers a backend started on this machine.

Workers come and go while containers keep running, so the list lives in a JSON
file; concurrent writers (several workers) take an flock, and every write replaces
the file atomically so readers never see half of it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
from collections.abc import Iterable, Iterator
from pathlib import Path

from pydantic import ValidationError

from sandboxes.backend import ContainerInfo
from sandboxes.persistence import write_json_atomically

log = logging.getLogger(__name__)


class ContainerRegistry:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock_path = path.with_name(path.name + ".lock")

    def load(self) -> list[ContainerInfo]:
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return [ContainerInfo.model_validate(item) for item in raw.get("containers", [])]
        except FileNotFoundError:
            return []
        except (ValueError, AttributeError, ValidationError) as err:
            log.warning("container registry %s is unreadable (%s); treating it as empty", self.path, err)
            return []

    def get(self, container_id: str) -> ContainerInfo | None:
        return next((info for info in self.load() if info.container_id == container_id), None)

    def upsert(self, info: ContainerInfo) -> None:
        with self._locked():
            others = [known for known in self.load() if known.container_id != info.container_id]
            self._save([*others, info])

    def remove(self, container_ids: Iterable[str]) -> None:
        dropped = set(container_ids)
        if not dropped:
            return
        with self._locked():
            self._save([known for known in self.load() if known.container_id not in dropped])

    def _save(self, containers: list[ContainerInfo]) -> None:
        write_json_atomically(self.path, {"containers": [info.model_dump(mode="json") for info in containers]})

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.lock_path.parent.mkdir(parents=True, exist_ok=True)
        with self.lock_path.open("a") as lock_file:
            fcntl.flock(lock_file, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock_file, fcntl.LOCK_UN)
