"""Base images on a host that reaches no registry: Debian's, bootstrapped from its package mirror.

`FROM debian:bookworm-slim` is the one base this project can make itself: mmdebstrap builds a
minimal Debian (`--variant=minbase`, without documentation, as the official slim image) from
the mirror, and podman imports it under the name a Dockerfile uses,
`docker.io/library/debian:bookworm-slim`, so builds find it with `--pull=never`. The tar is
kept in a cache shared by every store and CI run (`images.base_cache`), so it is bootstrapped
once per machine (about a minute) and imported in seconds after that. Any other base image
must already be in the store (`rollouts images load`); one that is not is refused in one line
that names it and says how to provide it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from temporal_rollouts.core.errors import ConfigError, ImageBuildFailed, UnknownBaseImage
from temporal_rollouts.sandbox.images.store import ImageStore, file_lock, tail

log = logging.getLogger(__name__)

BOOTSTRAP_TIMEOUT_S = 900.0
LOCK_WAIT_S = BOOTSTRAP_TIMEOUT_S + 60
SLIM_EXCLUDES = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-include=/usr/share/locale/locale.alias",
)
DEBIAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Bootstrap:
    """How to make one base image from a package mirror."""

    suite: str
    variant: str = "minbase"
    slim: bool = True

    @property
    def tar_name(self) -> str:
        return f"debian-{self.suite}{'-slim' if self.slim else ''}.tar.gz"


BOOTSTRAPS = {
    "docker.io/library/debian:bookworm-slim": Bootstrap("bookworm"),
    "docker.io/library/debian:bookworm": Bootstrap("bookworm", slim=False),
}
"""The base images this project bootstraps itself, by their normalized names."""


class BaseImages:
    """Makes sure the images a Dockerfile starts from are in the store, bootstrapping Debian's."""

    def __init__(self, store: ImageStore, cache: Path, mirror: str) -> None:
        self.store = store
        self.cache = Path(cache)
        self.mirror = mirror

    async def ensure(self, name: str, wanted_by: str) -> str:
        """The content id of image `name` (normalized; `ImageStore.content_id`), bootstrapping it when
        this project knows how.
        `wanted_by` says what needs it, for the refusal: "FROM in /path/Dockerfile", "named by item x"."""
        if (content := await self.store.content_id(name)) is not None:
            return content
        recipe = BOOTSTRAPS.get(name)
        if recipe is None:
            raise UnknownBaseImage(
                f"image {name} ({wanted_by}) is not in the image store {self.store.root} and no "
                f"registry is reachable: load it with `rollouts images load FILE.tar` (a `podman save` archive), "
                f"or start FROM one of {', '.join(sorted(BOOTSTRAPS))}, which are bootstrapped from the Debian mirror"
            )
        async with self.store.locked(f"base:{name}", LOCK_WAIT_S):
            if (content := await self.store.content_id(name)) is not None:
                return content
            tar = await self.tarball(recipe)
            await self.store.import_tar(tar, name, [f"ENV PATH={DEBIAN_PATH}", 'CMD ["bash"]'])
            log.info("imported base image %s from %s", name, tar)
            content = await self.store.content_id(name)
            assert content is not None
            return content

    async def tarball(self, recipe: Bootstrap) -> Path:
        """The cached root filesystem tar of `recipe`, bootstrapped from the mirror when missing."""
        self.cache.mkdir(parents=True, exist_ok=True)
        tar = self.cache / recipe.tar_name
        async with file_lock(self.cache / f"{recipe.tar_name}.lock", LOCK_WAIT_S):
            if tar.is_file() and tar.stat().st_size > 0:
                return tar
            if shutil.which("mmdebstrap") is None:
                raise ConfigError(
                    f"base image debian:{recipe.suite} must be bootstrapped, and mmdebstrap is not installed "
                    "(apt-get install mmdebstrap)"
                )
            await self._bootstrap(recipe, tar)
        return tar

    async def _bootstrap(self, recipe: Bootstrap, tar: Path) -> None:
        scratch = tar.with_name(f".{tar.name}.{os.getpid()}.partial.tar.gz")
        log_path = self.store.logs / f"bootstrap-{recipe.suite}.log"
        self.store.prepare()
        argv = ["mmdebstrap", "--variant", recipe.variant, "--format", "tar", "--quiet"]
        if recipe.slim:
            argv += [f"--dpkgopt={rule}" for rule in SLIM_EXCLUDES]
        argv += [recipe.suite, str(scratch), self.mirror]
        started = time.monotonic()
        log.info("bootstrapping debian:%s from %s (about a minute, once per machine)", recipe.suite, self.mirror)
        with log_path.open("ab") as sink:
            process = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=sink, stderr=asyncio.subprocess.STDOUT
            )
            try:
                async with asyncio.timeout(BOOTSTRAP_TIMEOUT_S):
                    returncode = await process.wait()
            except BaseException:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
                scratch.unlink(missing_ok=True)
                raise
        if returncode != 0:
            scratch.unlink(missing_ok=True)
            raise ImageBuildFailed(
                f"bootstrapping debian:{recipe.suite} from {self.mirror} failed (status {returncode}); "
                f"{log_path} ends with:\n{tail(log_path)}"
            )
        os.replace(scratch, tar)
        log.info("bootstrapped debian:%s in %.0fs: %s", recipe.suite, time.monotonic() - started, tar)


def default_cache() -> Path:
    """`$XDG_CACHE_HOME/temporal-rollouts/base-images`, else `~/.cache/...`."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "temporal-rollouts" / "base-images"
