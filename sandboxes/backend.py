"""Where sandbox containers run, behind one interface the pool uses.

A container is one sandbox server process with its slots; a backend starts,
stops and lists them (today locally, later e.g. on a cluster).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import ClassVar

from pydantic import BaseModel


class ContainerInfo(BaseModel):
    container_id: str
    url: str
    pid: int | None = None
    backend: str
    token_file: Path
    started_at: float

    def read_token(self) -> str:
        return self.token_file.read_text(encoding="utf-8").strip()


class SandboxBackend(ABC):
    name: ClassVar[str]

    @abstractmethod
    async def start_container(self) -> ContainerInfo:
        """Start one sandbox server and return once it answers /health."""

    @abstractmethod
    async def stop_container(self, container_id: str) -> None:
        """Stop a container; stopping one that is already gone is not an error."""

    @abstractmethod
    async def list_containers(self) -> list[ContainerInfo]:
        """The containers that are running and healthy now."""
