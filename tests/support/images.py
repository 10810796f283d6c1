"""What the image tests share: whether this host can build, and a store with Debian's base image.

The base image is bootstrapped from the Debian mirror into the shared cache
(`~/.cache/temporal-rollouts/base-images`, as the product does) the first time, about a minute;
after that each store imports it in seconds. `.ci/run` keeps that cache between CI runs.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from temporal_rollouts.core.settings import ImageSettings, PoolOptions
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sandbox.images.base_images import default_cache
from temporal_rollouts.sandbox.images.builder import ImageBuilder
from temporal_rollouts.sandbox.images.store import ImageStore
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.config import ServerOptions, SlotLimits
from tests.support.sandbox import sandbox_settings

BASE = "docker.io/library/debian:bookworm-slim"
TOOLS = ("podman", "buildah", "runc", "mmdebstrap", "ip")

needs_image_tools = pytest.mark.skipif(
    os.geteuid() != 0 or any(shutil.which(tool) is None for tool in TOOLS),
    reason="item images need root with podman, buildah, runc, mmdebstrap and iproute2 (.ci/run installs them)",
)


def unmount_under(folder: Path) -> None:
    """Unmount what containers-storage left mounted under a test's store (its overlay home is a bind
    mount of itself, and a layer stays mounted while it is in use), deepest first, so the folder can go."""
    prefix = str(Path(folder).resolve()) + "/"
    with open("/proc/self/mounts") as mounts:
        points = [line.split()[1] for line in mounts if line.split()[1].startswith(prefix)]
    for point in sorted(points, key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False)


def image_settings(**overrides) -> ImageSettings:
    return ImageSettings(base_cache=default_cache(), **overrides)


def builder_on(store: Path, **overrides) -> ImageBuilder:
    return ImageBuilder(image_settings(**overrides), ImageStore(store))


def write_context(folder: Path, dockerfile: str, files: dict[str, str] | None = None) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "Dockerfile").write_text(dockerfile)
    for name, content in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(content)
    return folder


@contextlib.asynccontextmanager
async def image_slot_pool(store: Path, data: Path) -> AsyncIterator[SandboxPool]:
    """A local pool of one container with two slots that run item images from `store` (a volume of 64 MB and
    20,000 files each), its server's data in `data`; every container it started is stopped at the end."""
    options = ServerOptions(limits=SlotLimits(disk_limit_mb=64, max_files=20_000))
    backend = LocalBackend(data, sandbox_settings(options, slots_per_container=2), images=builder_on(store))
    async with SandboxPool(backend, PoolOptions(min_containers=0, max_containers=1)) as made:
        try:
            yield made
        finally:
            for info in backend.registry.load():
                await backend.stop_container(info.container_id)
