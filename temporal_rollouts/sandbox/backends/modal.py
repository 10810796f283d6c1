"""ModalBackend: sandbox servers as Modal Sandboxes, one named sandbox per container index.

Modal is the registry. Sandboxes carry tags (`rollouts_pool`, `container_id`,
`started_at`), so any worker lists the pool with one `Sandbox.list(tags=...)`
call and `rollouts server stop` removes everything by tag. A sandbox is named
`<app_name>-<index>`, and Modal refuses a second running sandbox of one name
(`AlreadyExistsError`): that is the lock that keeps two workers from starting
one container twice; the loser finds the winner with `Sandbox.from_name`.

The server listens on an encrypted port reached through `tunnels()`; its token,
HMAC(pool secret, container id), travels as a Modal Secret made with
`Secret.from_dict`, never on a command line or in a workflow. The image is the
configured registry image plus the sandbox server package alone.

An item image is built by Modal itself, as a durable step before the rollout takes a
slot (`build_image`): `Image.from_dockerfile` on the item's build context (or
`from_registry` on its reference), with Modal's own Python added and the sandbox
server's layer on top (`sandbox.images.server_layer`, the same layer every backend
adds), built once per content key and kept by its Modal image id, from which every
worker creates its sandboxes (`Image.from_id`). Sandboxes of an image are named
`<app_name>-<key 12>-<index>` and tagged with the image.

Modal ends a sandbox at its lifetime (`timeout`) or after `idle_timeout` without
activity (open tunnel connections count). The idle timeout must exceed the lease
TTL (checked in settings). Before the lifetime ends, a sandbox within
`drain_margin_s` of it stops taking new leases (`accepting=False`), its holders
finish, and the pool's upkeep terminates it once idle and starts a fresh one.

Calls to Modal are few: per worker one `App.lookup`; per start one
`Sandbox.create` and one `tunnels()`; per listing one `Sandbox.list` (tags and
tunnel addresses of sandboxes already seen are cached by object id).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from temporal_rollouts.core.errors import ConfigError, ImageBuildFailed, SandboxError, SandboxUnreachable
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.sandbox_backends import ModalBackendConfig
from temporal_rollouts.core.settings import SandboxSettings, Settings
from temporal_rollouts.sandbox.backends.base import ContainerInfo, ContainerState, backend_config
from temporal_rollouts.sandbox.backends.remote import RemoteBackend
from temporal_rollouts.sandbox.backends.tokens import PoolSecret
from temporal_rollouts.sandbox.images import server_layer
from temporal_rollouts.sandbox.images.builder import slug
from temporal_rollouts.sandbox.images.context import context_key

log = logging.getLogger(__name__)

TOKEN_ENV = "SANDBOX_TOKEN"
TUNNEL_DOMAIN = ".modal.host"
"""Modal's tunnels are named <id>.<region>.modal.host: the server answers to those (`sandbox_server.http.hosts`)."""
POOL_TAG = "rollouts_pool"
TUNNEL_WAIT_S = 5


class _ExitedWhileStarting(SandboxError):
    """A sandbox whose server exited before it answered. Waited on as another worker's start, it was not one
    (killed, and still listed until Modal marks it finished): a new sandbox is made instead."""


@dataclass(frozen=True)
class _Seen:
    container_id: str
    url: str
    started_at: float
    image: BuiltImage | None = None


class ModalBackend(RemoteBackend):
    name = "modal"

    def __init__(
        self, sandbox: SandboxSettings, secret: PoolSecret, *, modal_api: ModuleType | Any | None = None
    ) -> None:
        if modal_api is None:
            import modal as modal_api  # the `cluster` extra
        super().__init__(sandbox, secret)
        self.config: ModalBackendConfig = backend_config(sandbox, "modal")
        self.modal = modal_api
        self._app: Any = None
        self._seen: dict[str, _Seen] = {}
        self._builds: dict[str, asyncio.Lock] = {}
        self._built: dict[str, BuiltImage] = {}

    @classmethod
    def from_settings(cls, settings: Settings, modal_api: Any = None) -> ModalBackend:
        config = backend_config(settings.sandbox, "modal")
        return cls(settings.sandbox, PoolSecret.from_env(config.secret_env), modal_api=modal_api)

    def container_name(self, index: int, image: BuiltImage | None = None) -> str:
        return f"{self.config.app_name}-{image.short + '-' if image else ''}{index}"

    # What a sandbox is made of -------------------------------------------------------------------

    def image(self) -> Any:
        """The configured image plus the sandbox server's layer (bubblewrap and libseccomp, the server's
        requirements and its package alone)."""
        return server_layer.modal_image(self.modal.Image.from_registry(self.config.image))

    def item_image(self, spec: ImageSpec) -> Any:
        """An item's image as Modal builds it: its Dockerfile (or reference), Modal's Python, the server's layer."""
        if spec.context is not None:
            context = Path(spec.context)
            base = self.modal.Image.from_dockerfile(
                context / spec.dockerfile, context_dir=context, add_python=server_layer.MODAL_PYTHON
            )
        else:
            base = self.modal.Image.from_registry(spec.reference, add_python=server_layer.MODAL_PYTHON)
        return server_layer.modal_image(base)

    async def build_image(self, spec: ImageSpec, wanted_by: str) -> BuiltImage:
        """Build the item's image in Modal (Modal keeps it by its definition: an image built before, by any
        worker, is not built again); rollouts of one key in this worker wait for one build and then reuse it."""
        if spec.context is not None:
            context = Path(spec.context)
            if not (context / spec.dockerfile).is_file():
                raise ImageBuildFailed(f"build context {context} has no Dockerfile at {spec.dockerfile}")
            key = await asyncio.to_thread(context_key, context, spec.dockerfile)
            name = f"modal/{spec.name or slug(context.name)}:{key}"
        else:
            key = hashlib.sha256(f"reference\0{spec.reference}".encode()).hexdigest()
            name = f"modal/{spec.reference}"
        async with self._builds.setdefault(key, asyncio.Lock()):
            if (known := self._built.get(key)) is not None:
                return known.model_copy(update={"built": False, "build_s": 0.0})
            started = time.monotonic()
            image = self.item_image(spec)
            try:
                built = await self._modal_call(f"build {spec.describe()}", image.build.aio(await self.app()))
            except self.modal.exception.ImageBuildError as err:
                raise ImageBuildFailed(f"Modal could not build {spec.describe()} ({wanted_by}): {err}") from err
            self._built[key] = BuiltImage(
                key=key, name=name, remote=built.object_id, built=True, build_s=round(time.monotonic() - started, 3)
            )
            return self._built[key]

    def command(self, container_id: str) -> list[str]:
        config = self.sandbox.for_container(
            root=f"{self.config.workspace_base}/root",
            container_id=container_id,
            host="0.0.0.0",
            port=self.config.port,
            token_env=TOKEN_ENV,
            allowed_hosts=[TUNNEL_DOMAIN],
        )
        return ["python", "-m", "temporal_rollouts.sandbox_server", *config.argv()]

    def create_options(self, container_id: str, image: BuiltImage | None = None) -> dict[str, Any]:
        """Every keyword of the one `Sandbox.create` call (tests check them against the installed modal)."""
        config = self.config
        secrets = [self.modal.Secret.from_name(name) for name in config.secrets]
        secrets.append(self.modal.Secret.from_dict({TOKEN_ENV: self.secret.token(container_id)}))
        tags = {POOL_TAG: config.app_name, "container_id": container_id, "started_at": str(int(time.time()))}
        if image is not None:
            tags.update({"image_key": image.key, "image_name": image.name, "image_id": image.remote or ""})
        return {
            "name": container_id,
            "tags": tags,
            "image": self.image() if image is None else self.modal.Image.from_id(image.remote),
            "secrets": secrets,
            "env": {**config.env_vars, "PYTHONPATH": server_layer.SERVER_LIB},
            "timeout": config.max_lifetime_s,
            "idle_timeout": config.idle_timeout_s,
            "gpu": config.gpu,
            "cpu": config.cpu,
            "memory": config.memory,
            "encrypted_ports": [config.port],
            "workdir": config.workspace_base,
        }

    # Modal calls -------------------------------------------------------------------------------

    async def _modal_call(self, what: str, call: Any) -> Any:
        errors = self.modal.exception
        try:
            return await call
        except (errors.NotFoundError, errors.AlreadyExistsError, errors.ImageBuildError):
            raise
        except errors.AuthError as err:
            raise ConfigError(f"Modal refused our credentials ({what}): {err}") from err
        except errors.Error as err:
            raise SandboxUnreachable(f"Modal failed to {what}: {err}") from err

    async def app(self) -> Any:
        if self._app is None:
            self._app = await self._modal_call(
                "look up the app", self.modal.App.lookup.aio(self.config.app_name, create_if_missing=True)
            )
        return self._app

    async def _sandboxes(self) -> list[Any]:
        app = await self.app()

        async def collect() -> list[Any]:
            return [
                sb async for sb in self.modal.Sandbox.list.aio(app_id=app.app_id, tags={POOL_TAG: self.config.app_name})
            ]

        return await self._modal_call("list sandboxes", collect())

    async def _describe(self, sandbox: Any) -> _Seen | None:
        """Container id, tunnel URL and start time of a sandbox, asked of Modal once per sandbox; None
        while it cannot say yet (its tunnel is still opening), so one starting sandbox never holds up
        a listing."""
        seen = self._seen.get(sandbox.object_id)
        if seen is None:
            try:
                tags = await self._modal_call("read sandbox tags", sandbox.get_tags.aio())
                tunnels = await self._modal_call("read sandbox tunnels", sandbox.tunnels.aio(timeout=TUNNEL_WAIT_S))
            except SandboxUnreachable as err:
                log.info("Modal sandbox %s cannot be described yet: %s", sandbox.object_id, err)
                return None
            if "container_id" not in tags or self.config.port not in tunnels:
                return None
            image = None
            if tags.get("image_key"):
                image = BuiltImage(key=tags["image_key"], name=tags["image_name"], remote=tags.get("image_id") or None)
            seen = _Seen(
                tags["container_id"], tunnels[self.config.port].url, float(tags.get("started_at", time.time())), image
            )
            self._seen[sandbox.object_id] = seen
        return seen

    def _accepting(self, seen: _Seen) -> bool:
        return time.time() - seen.started_at < self.config.max_lifetime_s - self.config.drain_margin_s

    def _info(self, seen: _Seen) -> ContainerInfo:
        return ContainerInfo(
            container_id=seen.container_id,
            url=seen.url,
            backend=self.name,
            started_at=seen.started_at,
            accepting=self._accepting(seen),
            image=seen.image,
        )

    # The backend interface ---------------------------------------------------------------------

    async def list_containers(self) -> list[ContainerInfo]:
        described = [seen for seen in await asyncio.gather(*map(self._describe, await self._sandboxes())) if seen]
        states = await asyncio.gather(*(self.probe(seen.url, seen.container_id) for seen in described))
        return [self._info(seen) for seen, state in zip(described, states, strict=True) if state == "healthy"]

    async def container_state(self, container_id: str) -> ContainerState:
        sandbox = await self._by_name(container_id)
        if sandbox is None:
            return "unknown"
        seen = await self._describe(sandbox)
        return "unresponsive" if seen is None else await self.probe(seen.url, container_id)

    async def start_container(self, container_id: str | None = None, image: BuiltImage | None = None) -> ContainerInfo:
        """Create the lowest free name of the image (or `container_id`); a name another worker took first is
        waited for."""
        app = await self.app()
        if image is not None and not image.remote:
            raise SandboxError(f"image {image.name} was not built in Modal (no Modal image id)")
        if container_id is None:
            described = [seen for seen in await asyncio.gather(*map(self._describe, await self._sandboxes())) if seen]
            described = [seen for seen in described if (seen.image and seen.image.key) == (image and image.key)]
            taken = {seen.container_id for seen in described}
            states = await asyncio.gather(*(self.probe(seen.url, seen.container_id) for seen in described))
            for name in sorted(
                seen.container_id for seen, state in zip(described, states, strict=True) if state != "healthy"
            ):
                # Another worker is starting one: it is the one more we need. One whose server has already exited
                # (killed, and still listed until Modal marks it finished) is not starting: a new one is made.
                sandbox = await self._by_name(name)
                if sandbox is None:
                    continue
                try:
                    return await self._wait_healthy(sandbox, name)
                except _ExitedWhileStarting:
                    continue
            # twice max_containers names: a sandbox draining before its lifetime ends still holds its name
            names = [self.container_name(i, image) for i in range(2 * self.sandbox.max_containers)]
            free = [name for name in names if name not in taken]
            if not free:
                raise SandboxError(f"all {2 * self.sandbox.max_containers} Modal sandbox names are in use")
            container_id = free[0]
        try:
            sandbox = await self._modal_call(
                "create a sandbox",
                self.modal.Sandbox.create.aio(
                    *self.command(container_id), app=app, **self.create_options(container_id, image)
                ),
            )
            log.info("created Modal sandbox %s", container_id)
        except self.modal.exception.AlreadyExistsError:
            log.info("Modal sandbox %s exists already (another worker created it); waiting for it", container_id)
            sandbox = await self._by_name(container_id)
            if sandbox is None:
                raise SandboxUnreachable(f"Modal sandbox {container_id} existed a moment ago and is gone") from None
        return await self._wait_healthy(sandbox, container_id)

    async def stop_container(self, container_id: str) -> None:
        sandbox = await self._by_name(container_id)
        if sandbox is not None:
            await self._modal_call("terminate a sandbox", sandbox.terminate.aio())
            self._seen.pop(sandbox.object_id, None)

    async def shutdown(self, purge: bool | None = None) -> list[str]:
        """Terminate every sandbox tagged with this pool, answering or not."""
        stopped = []
        for sandbox in await self._sandboxes():
            seen = await self._describe(sandbox)
            await self._modal_call("terminate a sandbox", sandbox.terminate.aio())
            self._seen.pop(sandbox.object_id, None)
            stopped.append(seen.container_id if seen else sandbox.object_id)
        return stopped

    async def _by_name(self, container_id: str) -> Any:
        try:
            return await self._modal_call(
                "find a sandbox", self.modal.Sandbox.from_name.aio(self.config.app_name, container_id)
            )
        except self.modal.exception.NotFoundError:
            return None

    async def _wait_healthy(self, sandbox: Any, container_id: str) -> ContainerInfo:
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            seen = await self._describe(sandbox)
            if seen is not None and await self.probe(seen.url, container_id) == "healthy":
                return self._info(seen)
            if await self._modal_call("poll a sandbox", sandbox.poll.aio()) is not None:
                self._seen.pop(sandbox.object_id, None)
                raise _ExitedWhileStarting(f"Modal sandbox {container_id} exited while starting; see its logs in Modal")
            if time.monotonic() > deadline:
                await self._modal_call("terminate a sandbox", sandbox.terminate.aio())  # never leave a paid one behind
                raise SandboxUnreachable(
                    f"Modal sandbox {container_id} did not answer within {self.config.start_timeout_s:g}s"
                )
            await asyncio.sleep(0.25)
