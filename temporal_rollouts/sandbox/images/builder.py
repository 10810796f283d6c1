"""Building an item's image with buildah, once per build context content, on this host.

A build context's image is named `localhost/rollouts/<name>:<key>`, where the key is the digest
of the context's content and its base images' ids (`context.context_key`). The store is the
cache: a key that is in it is handed out at once. A key that is not is built under the store's
lock for that key, which every process of the host shares, so rollouts of one task that ask at
the same moment build it once and the others find it built when the lock frees.

At most `images.max_concurrent_builds` builds run on the host at once (`store.build_turn`): a task
set of hundreds of images queues its builds instead of starting them all on a few cores.

A build never pulls (`--pull=never`: no registry is reachable); its base images are made ready
first (`base_images`), and an unknown one is refused in one line. Its RUN steps reach only the
package mirrors (`build_network`). Intermediate layers are kept (`--layers`), so tasks whose
Dockerfiles share their first steps share their layers. Each build's log is kept in the store
(`logs/<name>-<key>.log`); a failed build's error ends with its tail.

For backends whose hosts pull images (Nomad), `publish` adds the sandbox server's layer on top
(`server_layer`: the server then runs inside the image) and pushes the result to a registry.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from temporal_rollouts.core.errors import ImageBuildFailed, ImageBuildTimedOut, SandboxUnreachable
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.settings import ImageSettings, Settings
from temporal_rollouts.sandbox.images import server_layer
from temporal_rollouts.sandbox.images.base_images import BaseImages, default_cache
from temporal_rollouts.sandbox.images.build_network import build_network
from temporal_rollouts.sandbox.images.context import context_key
from temporal_rollouts.sandbox.images.dockerfile import normalize, read_base_images
from temporal_rollouts.sandbox.images.store import ImageStore, tail

log = logging.getLogger(__name__)

TAG_PREFIX = "localhost/rollouts"
LOCK_MARGIN_S = 60.0
LOG_TAIL_CHARS = 3000
STOP_GRACE_S = 15.0
"""A build stopped (past its timeout, or its step cancelled) gets this long to stop its RUN container."""


class ImageBuilder:
    """Builds item images into one store (`images.store`), or finds them there."""

    store: ImageStore
    """The store the images are built into and slots' roots are stacked from."""
    settings: ImageSettings

    def __init__(self, settings: ImageSettings, store: ImageStore) -> None:
        self.settings = settings
        self.store = store
        self.bases = BaseImages(store, settings.base_cache or default_cache(), settings.debian_mirror)

    @classmethod
    def from_settings(cls, settings: Settings) -> ImageBuilder:
        return cls(settings.images, ImageStore(settings.image_store))

    async def ready(self, spec: ImageSpec, wanted_by: str = "the item") -> BuiltImage:
        """The image `spec` names, built now if it is not in the store yet."""
        if spec.reference is not None:
            return await self._referenced(spec.reference, wanted_by)
        return await self._built(spec)

    async def _referenced(self, reference: str, wanted_by: str) -> BuiltImage:
        name = normalize(reference)
        content = await self.bases.ensure(name, f"named by {wanted_by}")
        image_id, config = await self.store.inspect(name)
        return BuiltImage(key=content, name=name, image_id=image_id, config=config)

    async def _built(self, spec: ImageSpec) -> BuiltImage:
        assert spec.context is not None
        context, dockerfile = _checked_context(spec)
        base_ids = [await self.bases.ensure(base, f"FROM in {dockerfile}") for base in read_base_images(dockerfile)]
        key = context_key(context, spec.dockerfile, base_ids)
        tag = f"{TAG_PREFIX}/{spec.name or slug(context.name)}:{key}"
        timeout_s = spec.build_timeout_s or self.settings.build_timeout_s
        async with self.store.locked(key, timeout_s + LOCK_MARGIN_S):
            if await self.store.exists(tag):
                image_id, config = await self.store.inspect(tag)
                return BuiltImage(key=key, name=tag, image_id=image_id, config=config)
            started = time.monotonic()
            await self._build(context, dockerfile, tag, key, timeout_s)
            build_s = round(time.monotonic() - started, 3)
            image_id, config = await self.store.inspect(tag)
        log.info("built %s in %.1fs", tag, build_s)
        return BuiltImage(key=key, name=tag, image_id=image_id, config=config, built=True, build_s=build_s)

    async def publish(self, image: BuiltImage, registry: str) -> BuiltImage:
        """`image` with the sandbox server's layer on top, pushed to `registry` (once per content: the layer's
        key covers the image's key and the server's package); `remote` names the pushed image."""
        repository = image.name.rpartition(":")[0].rpartition("/")[2] or "image"
        folder = self.store.root / "server-layers" / image.key[:32]
        async with self.store.locked(f"layer:{image.key}", self.settings.build_timeout_s + LOCK_MARGIN_S):
            wheels = await server_layer.wheels(self.store.root / "wheels")
            await asyncio.to_thread(server_layer.stage_context, folder, image.name, wheels)
            key = context_key(folder, "Dockerfile", [image.key])
            tag = f"{TAG_PREFIX}-server/{repository}:{key}"
            if not await self.store.exists(tag):
                await self._build(folder, folder / "Dockerfile", tag, key, self.settings.build_timeout_s)
            remote = f"{registry.rstrip('/')}/{repository}:{key}"
            pushed = self.store.root / "pushed" / hashlib.sha256(remote.encode()).hexdigest()
            if not pushed.exists():
                await self._push(tag, remote)
                pushed.parent.mkdir(parents=True, exist_ok=True)
                pushed.write_text(remote + "\n")
        return image.model_copy(update={"remote": remote})

    async def _push(self, tag: str, remote: str) -> None:
        verify = "true" if self.settings.registry_tls_verify else "false"
        ran = await self.store.run(
            "podman", "push", f"--tls-verify={verify}", tag, f"docker://{remote}", timeout_s=1800
        )
        if ran.returncode != 0:
            raise SandboxUnreachable(f"pushing {tag} to {remote} failed: {ran.output.strip()[-LOG_TAIL_CHARS:]}")

    async def _build(self, context: Path, dockerfile: Path, tag: str, key: str, timeout_s: float) -> None:
        turns = self.settings.max_concurrent_builds or os.cpu_count() or 1
        async with self.store.build_turn(turns):
            await self._build_now(context, dockerfile, tag, key, timeout_s)

    async def _build_now(self, context: Path, dockerfile: Path, tag: str, key: str, timeout_s: float) -> None:
        log_path = self.store.logs / f"{tag.rpartition('/')[2].replace(':', '-')[: 64 + 20]}.log"
        self.store.prepare()
        log_path.write_bytes(b"")
        runtime_root = self.store.runroot / "builds" / key[:16]
        async with build_network(self.settings.build_network, self.settings.mirror_hosts) as network:
            argv = ["bud", "--pull=never", "--layers", "--force-rm", "--quiet=false", *network.buildah_args()]
            argv += [f"--runtime-flag=root={runtime_root}", "--file", str(dockerfile), "--tag", tag, str(context)]
            try:
                ran = await self.store.run("buildah", *argv, timeout_s=timeout_s, log=log_path, grace_s=STOP_GRACE_S)
            except TimeoutError:
                raise ImageBuildTimedOut(
                    f"building {context} ran past its {timeout_s:g}s timeout; {log_path} ends with:\n"
                    f"{tail(log_path, LOG_TAIL_CHARS)}"
                ) from None
            finally:
                await stop_leftover_runs(runtime_root)
        if ran.returncode != 0:
            raise ImageBuildFailed(
                f"building {context} failed (buildah status {ran.returncode}); {log_path} ends with:\n"
                f"{tail(log_path, LOG_TAIL_CHARS)}"
            )


async def stop_leftover_runs(runtime_root: Path) -> None:
    """Kill and delete any RUN container a stopped build left running: each build has a runc state
    folder of its own, so only its own are found."""
    if not runtime_root.is_dir():
        return
    listed = await asyncio.to_thread(
        subprocess.run, ["runc", "--root", str(runtime_root), "list", "-q"], capture_output=True, text=True, check=False
    )
    for container in listed.stdout.split():
        log.warning("killing RUN container %s that a stopped build left running", container)
        for argv in (["kill", container, "KILL"], ["delete", "--force", container]):
            await asyncio.to_thread(
                subprocess.run, ["runc", "--root", str(runtime_root), *argv], capture_output=True, check=False
            )
    shutil.rmtree(runtime_root, ignore_errors=True)


def _checked_context(spec: ImageSpec) -> tuple[Path, Path]:
    """The context folder and its Dockerfile, which must lie inside it (no link out of it)."""
    assert spec.context is not None
    context = Path(spec.context)
    if not context.is_dir():
        raise ImageBuildFailed(f"build context {context} is not a folder")
    dockerfile = context / spec.dockerfile
    resolved = dockerfile.resolve()
    if not resolved.is_relative_to(context.resolve()) or not resolved.is_file():
        raise ImageBuildFailed(f"build context {context} has no Dockerfile at {spec.dockerfile} (a file inside it)")
    return context, dockerfile


def slug(text: str) -> str:
    """A valid repository name part from any folder name."""
    cleaned = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")
    return cleaned[:63] or "image"
