"""NomadBackend: sandbox servers as Nomad jobs, one job per container index.

Nomad, not a file on some worker's disk, is the registry: every worker lists the
jobs named `<job_prefix>-<index>` and reads their addresses from their running
allocations, so workers on any host see one pool. The job name is the lock that
keeps two workers from starting one container twice: a job is registered with
`EnforceIndex` and index 0, which Nomad accepts only when the job is new; the
loser of a race simply uses the winner's container.

Each server's token is HMAC(pool secret, container id). It reaches the task
through a Nomad Variable at `nomad/jobs/<job id>` (readable by that job's tasks
through their workload identity) rendered by a template into the task's secrets
dir, so it is in neither the job spec nor any workflow history.

An item image runs under the docker driver: the build step builds it on the worker with
buildah, adds the sandbox server's layer (`sandbox.images.server_layer`, the same layer
every backend adds), and pushes the result to `images.registry`, from which the Nomad
clients pull it. Its jobs are named `<job_prefix>-<key 12>-<index>` and carry the image
in their `Meta`, so any worker lists them with their image.

Nomad owns liveness: the restart policy restarts a crashed server in its
allocation, where `$NOMAD_ALLOC_DIR/data` still holds its persisted leases and
stored results; a lost allocation is rescheduled (a new address, found again on
the next call that fails). A job whose allocations exhausted both policies is
dead; re-registering it (again under an index check, so only one worker does) is
the restart in place.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable
from typing import Any, TypeVar

from temporal_rollouts.core.errors import ConfigError, SandboxError, SandboxUnreachable
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.sandbox_backends import NomadBackendConfig
from temporal_rollouts.core.settings import SandboxSettings, Settings
from temporal_rollouts.sandbox.backends.base import ContainerInfo, ContainerState, backend_config
from temporal_rollouts.sandbox.backends.remote import RemoteBackend
from temporal_rollouts.sandbox.backends.tokens import PoolSecret
from temporal_rollouts.sandbox.images.builder import ImageBuilder
from temporal_rollouts.sandbox_server.config import ServerOptions

log = logging.getLogger(__name__)

PORT_LABEL = "http"
DOCKER_PORT = 8080
SECONDS = 1_000_000_000
IMAGE_META = "rollouts_image"
"""The job's Meta key holding its item image (JSON: key, name, remote); absent for the pool's own image."""
Result = TypeVar("Result")


def job_spec(
    config: NomadBackendConfig, server: ServerOptions, job_id: str, image: BuiltImage | None = None
) -> dict[str, Any]:
    """The Nomad job (JSON API form) that runs one sandbox server, started with `server`'s options; with
    `image`, inside that item image (pushed with the server's layer, whose entrypoint is the server)."""
    where = {
        "container_id": job_id,
        "root": "${NOMAD_ALLOC_DIR}/data",
        "token_file": "${NOMAD_SECRETS_DIR}/token",
    }
    if image is not None and (config.driver != "docker" or not image.remote):
        raise ConfigError(f"item image {image.name} needs the docker driver and a pushed image (images.registry)")
    if config.driver == "raw_exec":  # on the host itself: it binds the allocation's address and port
        server_config = server.for_container(**where, host="${NOMAD_IP_http}")
        task_config: dict[str, Any] = {
            "command": config.python,
            "args": ["-m", "temporal_rollouts.sandbox_server", *server_config.argv(port="${NOMAD_PORT_http}")],
        }
        env = {"PYTHONPATH": config.pythonpath} if config.pythonpath else {}
        ports = [{"Label": PORT_LABEL}]
    else:  # in a container: every address of it, reached through the host's address and a mapped port
        server_config = server.for_container(
            **where, host="0.0.0.0", port=DOCKER_PORT, allowed_hosts=["${NOMAD_IP_http}"]
        )
        task_config = {
            "image": config.image if image is None else image.remote,
            "ports": [PORT_LABEL],
            "force_pull": False,
            "privileged": config.privileged,
            "args": server_config.argv(),
        }
        # Every server of the host claims slot uids from one folder (sandbox_server/isolation/uids.py).
        if config.share_uid_claims:
            claims = str(server_config.uid_claims_dir)
            task_config["volumes"] = [f"{claims}:{claims}"]
        env = {}
        ports = [{"Label": PORT_LABEL, "To": DOCKER_PORT}]
    return {
        "ID": job_id,
        "Name": job_id,
        "Type": "service",
        "Datacenters": [config.datacenter],
        "Namespace": config.namespace,
        "Region": config.region,
        "Meta": {
            "rollouts_pool": config.job_prefix,
            **({IMAGE_META: image.model_dump_json(include={"key", "name", "remote"})} if image else {}),
        },
        "TaskGroups": [
            {
                "Name": "sandbox",
                "Count": 1,
                "Networks": [{"DynamicPorts": ports}],
                # A crashed server restarts in its allocation, where its data dir keeps leases and results.
                "RestartPolicy": {"Attempts": 3, "Interval": 300 * SECONDS, "Delay": 10 * SECONDS, "Mode": "fail"},
                "ReschedulePolicy": {
                    "Attempts": 5,
                    "Interval": 3600 * SECONDS,
                    "Delay": 30 * SECONDS,
                    "DelayFunction": "exponential",
                    "MaxDelay": 300 * SECONDS,
                    "Unlimited": False,
                },
                "EphemeralDisk": {"Sticky": True, "Migrate": True, "SizeMB": 1024},
                "Tasks": [
                    {
                        "Name": "server",
                        "Driver": config.driver,
                        "Config": task_config,
                        "Env": env,
                        "Templates": [
                            {
                                "EmbeddedTmpl": f'{{{{ with nomadVar "nomad/jobs/{job_id}" }}}}{{{{ .token }}}}{{{{ end }}}}',
                                "DestPath": "secrets/token",
                                "ChangeMode": "restart",
                                "Perms": "0600",
                            }
                        ],
                        "Resources": {"CPU": config.cpu, "MemoryMB": config.memory},
                    }
                ],
            }
        ],
    }


class NomadBackend(RemoteBackend):
    name = "nomad"

    def __init__(
        self,
        sandbox: SandboxSettings,
        secret: PoolSecret,
        *,
        acl_token: str | None = None,
        images: ImageBuilder | None = None,
    ) -> None:
        """Jobs as `sandbox` says (its `backend` must be the Nomad one); `images` builds item images here and
        pushes them to its `images.registry` for the clients to pull (None: no item images)."""
        import nomad  # python-nomad, the `cluster` extra

        super().__init__(sandbox, secret)
        self.config: NomadBackendConfig = backend_config(sandbox, "nomad")
        self._nomad = nomad
        self._client = nomad.Nomad(
            address=self.config.address,
            token=acl_token,
            namespace=self.config.namespace,
            region=self.config.region,
            timeout=10,
        )
        self.images = images
        """Builds item images on this worker (buildah), adds the server's layer and pushes them where the
        Nomad clients pull from (its settings' `registry`)."""
        self._ports: dict[str, str] = {}
        self._images: dict[tuple[str, int], BuiltImage | None] = {}
        self._checked = False

    @classmethod
    def from_settings(cls, settings: Settings) -> NomadBackend:
        config = backend_config(settings.sandbox, "nomad")
        acl_token = None
        if config.token_env is not None:
            acl_token = os.environ.get(config.token_env) or None
        return cls(
            settings.sandbox,
            PoolSecret.from_env(config.secret_env),
            acl_token=acl_token,
            images=ImageBuilder.from_settings(settings),
        )

    def job_id(self, index: int, image: BuiltImage | None = None) -> str:
        return f"{self.config.job_prefix}-{image.short + '-' if image else ''}{index}"

    async def build_image(self, spec: ImageSpec, wanted_by: str) -> BuiltImage:
        """Build the item's image here, add the server's layer and push it where the clients pull from."""
        if self.config.driver != "docker":
            raise ConfigError(
                f"{wanted_by} names {spec.describe()}: item images on Nomad run under the docker driver "
                '(sandbox.backend.driver = "docker")'
            )
        registry = self.images.settings.registry if self.images is not None else None
        if self.images is None or not registry:
            raise ConfigError(
                f"{wanted_by} names {spec.describe()}: set images.registry to a registry the Nomad clients pull "
                "from (docs/images.md says how to build and push by hand)"
            )
        published = spec.reference is not None and spec.reference.startswith(registry.rstrip("/") + "/")
        if published:  # pushed there ahead, the server's layer and all
            key = hashlib.sha256(f"reference\0{spec.reference}".encode()).hexdigest()
            return BuiltImage(key=key, name=spec.reference, remote=spec.reference)
        return await self.images.publish(await self.images.ready(spec, wanted_by), registry)

    async def _nomad_call(self, call: Callable[[], Result]) -> Result:
        """One python-nomad call in a thread; a refused token is a configuration error, anything else
        that keeps Nomad from answering is SandboxUnreachable (retryable)."""
        errors = self._nomad.api.exceptions
        try:
            return await asyncio.to_thread(call)
        except errors.URLNotAuthorizedNomadException as err:
            env = self.config.token_env
            raise ConfigError(f"Nomad at {self.config.address} refused the ACL token (from ${env}): {err}") from err
        except errors.URLNotFoundNomadException:
            raise
        except errors.BaseNomadException as err:
            if _conflict(err):
                raise
            raise SandboxUnreachable(f"Nomad at {self.config.address} failed: {err}") from err

    async def check_access(self) -> None:
        """Fail early with a clear message when Nomad cannot be reached or refuses our token."""
        if self._checked:
            return
        if self._client.acl.token:
            await self._nomad_call(self._client.acl.get_self_token)
        else:
            await self._nomad_call(lambda: self._client.jobs.get_jobs(prefix=self.config.job_prefix + "-"))
        self._checked = True

    # Listing ---------------------------------------------------------------------------------

    async def _jobs(self) -> list[dict[str, Any]]:
        prefix = self.config.job_prefix + "-"
        jobs = await self._nomad_call(lambda: self._client.jobs.get_jobs(prefix=prefix))
        return [job for job in jobs if _index_of(job["ID"], prefix) is not None]

    async def _running_alloc(self, job_id: str) -> tuple[str | None, bool]:
        """(URL of the job's running allocation, whether any allocation is starting or running)."""
        try:
            allocs = await self._nomad_call(lambda: self._client.job.get_allocations(job_id))
        except self._nomad.api.exceptions.URLNotFoundNomadException:
            return None, False
        wanted = [
            a for a in allocs if a.get("DesiredStatus") == "run" and a.get("ClientStatus") in ("pending", "running")
        ]
        running = sorted((a for a in wanted if a["ClientStatus"] == "running"), key=lambda a: a.get("CreateIndex", 0))
        if not running:
            return None, bool(wanted)
        alloc_id = running[-1]["ID"]
        if alloc_id not in self._ports:
            full = await self._nomad_call(lambda: self._client.allocation.get_allocation(alloc_id))
            self._ports[alloc_id] = _address(full)
        return self._ports[alloc_id], True

    async def _state(self, job: dict[str, Any]) -> tuple[ContainerState, str | None]:
        if job.get("Stop"):
            return "unknown", None
        url, alive = await self._running_alloc(job["ID"])
        if url is not None and await self.probe(url, job["ID"]) == "healthy":
            return "healthy", url
        if alive:
            return "unresponsive", url
        return ("dead" if job.get("Status") == "dead" else "unresponsive"), None

    async def list_containers(self) -> list[ContainerInfo]:
        await self.check_access()
        jobs = await self._jobs()
        states = await asyncio.gather(*(self._state(job) for job in jobs))
        return [
            await self._info(job, url)
            for job, (state, url) in zip(jobs, states, strict=True)
            if state == "healthy" and url is not None
        ]

    async def dead_containers(self) -> list[ContainerInfo]:
        jobs = [job for job in await self._jobs() if job.get("Status") == "dead" and not job.get("Stop")]
        return [await self._info(job, "") for job in jobs]

    async def container_state(self, container_id: str) -> ContainerState:
        try:
            job = await self._nomad_call(lambda: self._client.job.get_job(container_id))
        except self._nomad.api.exceptions.URLNotFoundNomadException:
            return "unknown"
        return (await self._state(job))[0]

    async def _info(self, job: dict[str, Any], url: str) -> ContainerInfo:
        return ContainerInfo(
            container_id=job["ID"], url=url, backend=self.name, started_at=time.time(), image=await self._image(job)
        )

    async def _image(self, job: dict[str, Any]) -> BuiltImage | None:
        """The job's item image, from its Meta (the job list's stubs carry none: the job is read once per
        registration, then remembered)."""
        if "Meta" in job:
            return _image_of(job)
        if _key_of_id(job["ID"], self.config.job_prefix + "-") is None:
            return None
        version = (job["ID"], int(job.get("JobModifyIndex") or 0))
        if version not in self._images:
            full = await self._nomad_call(lambda: self._client.job.get_job(job["ID"]))
            self._images[version] = _image_of(full)
        return self._images[version]

    # Starting and stopping ---------------------------------------------------------------------

    async def start_container(self, container_id: str | None = None, image: BuiltImage | None = None) -> ContainerInfo:
        """Register the lowest free index of the image (or `container_id`) unless its job exists; return it once
        healthy. A job another worker registered first is waited for, never started twice."""
        await self.check_access()
        if container_id is None:
            prefix = self.config.job_prefix + "-"
            jobs = [
                job for job in await self._jobs() if _key_of_id(job["ID"], prefix) == (image.short if image else None)
            ]
            taken = {job["ID"] for job in jobs}
            dead = {job["ID"] for job in jobs if job.get("Status") == "dead" or job.get("Stop")}
            healthy = {info.container_id for info in await self.list_containers()} & taken
            if starting := sorted(taken - healthy - dead):
                # Another worker is starting one (or Nomad is restarting it): it is the one more we need.
                return await self._wait_healthy(starting[0])
            free = [
                self.job_id(i, image) for i in range(self.sandbox.max_containers) if self.job_id(i, image) not in taken
            ]
            if not free:
                raise SandboxError(f"all {self.sandbox.max_containers} Nomad sandbox jobs exist already")
            container_id = free[0]
        elif _index_of(container_id, self.config.job_prefix + "-") is None:
            raise SandboxError(f"{container_id!r} is not a job of this pool ({self.config.job_prefix}-<index>)")
        await self._put_token(container_id)
        spec = job_spec(self.config, self.sandbox, container_id, image)
        try:
            await self._nomad_call(
                lambda: self._client.job.register_job(
                    container_id, {"Job": spec, "EnforceIndex": True, "JobModifyIndex": 0}
                )
            )
            log.info("registered Nomad job %s", container_id)
        except self._nomad.api.exceptions.BaseNomadException as err:
            if not _conflict(err):
                raise
            log.info("Nomad job %s exists already (another worker started it); waiting for it", container_id)
        return await self._wait_healthy(container_id)

    async def restart_container(self, container_id: str) -> ContainerInfo:
        """Re-register a dead job under an index check: one worker does it, the others wait for it."""
        job = await self._nomad_call(lambda: self._client.job.get_job(container_id))
        if job.get("Status") == "dead" and not job.get("Stop"):
            spec = job_spec(self.config, self.sandbox, container_id, _image_of(job))
            body = {"Job": spec, "EnforceIndex": True, "JobModifyIndex": job["JobModifyIndex"]}
            try:
                await self._nomad_call(lambda: self._client.job.register_job(container_id, body))
            except self._nomad.api.exceptions.BaseNomadException as err:
                if not _conflict(err):
                    raise
        return await self._wait_healthy(container_id)

    async def stop_container(self, container_id: str) -> None:
        await self._deregister(container_id, purge=True)

    async def shutdown(self, purge: bool | None = None) -> list[str]:
        purge = self.config.purge_job_on_shutdown if purge is None else purge
        ids = [job["ID"] for job in await self._jobs() if not job.get("Stop")]
        for container_id in ids:
            await self._deregister(container_id, purge=purge)
        return ids

    async def prepare(self) -> None:
        await self.check_access()
        if self.config.purge_job_on_start and (purged := await self.purge_stuck_jobs()):
            log.warning("purged Nomad jobs with no running allocation (purge_job_on_start): %s", ", ".join(purged))

    async def purge_stuck_jobs(self) -> list[str]:
        """`purge_job_on_start`: purge this pool's jobs that have no running allocation (dead, or stuck in
        restart backoff), so they start afresh. Jobs that serve leases are left alone; a job another worker
        is starting at this very moment is purged too, and that worker's start fails and is retried."""
        purged = []
        for job in await self._jobs():
            url, _ = await self._running_alloc(job["ID"])
            if url is None:
                await self._deregister(job["ID"], purge=True)
                purged.append(job["ID"])
        return purged

    async def _deregister(self, container_id: str, purge: bool) -> None:
        try:
            await self._nomad_call(lambda: self._client.job.deregister_job(container_id, purge=purge))
        except self._nomad.api.exceptions.URLNotFoundNomadException:
            pass

    async def _put_token(self, job_id: str) -> None:
        path = f"nomad/jobs/{job_id}"
        payload = {
            "Namespace": self.config.namespace or "default",
            "Path": path,
            "Items": {"token": self.secret.token(job_id)},
        }
        await self._nomad_call(lambda: self._client.variable.create_variable(path, payload))

    async def _wait_healthy(self, container_id: str) -> ContainerInfo:
        deadline = time.monotonic() + self.config.start_timeout_s
        while True:
            try:
                job = await self._nomad_call(lambda: self._client.job.get_job(container_id))
            except self._nomad.api.exceptions.URLNotFoundNomadException:
                raise SandboxError(f"Nomad job {container_id} was removed while starting") from None
            state, url = await self._state(job)
            if state == "healthy" and url is not None:
                return await self._info(job, url)
            if state == "dead":
                raise SandboxError(f"Nomad job {container_id} died while starting: see `nomad alloc status`")
            if time.monotonic() > deadline:
                raise SandboxUnreachable(
                    f"Nomad job {container_id} had no allocation answering /health within {self.config.start_timeout_s:g}s"
                )
            await asyncio.sleep(0.2)


def _conflict(err: Exception) -> bool:
    response = getattr(err, "nomad_resp", None)
    text = getattr(response, "text", "") or ""
    return "job already exists" in text or "conflicting job modify index" in text


def _index_of(job_id: str, prefix: str) -> int | None:
    """The index of a job of this pool: `<prefix><index>`, or `<prefix><image key 12>-<index>`."""
    rest = job_id[len(prefix) :] if job_id.startswith(prefix) else ""
    key, dash, index = rest.rpartition("-")
    if dash and not (len(key) == 12 and all(c in "0123456789abcdef" for c in key)):
        return None
    return int(index) if index.isdigit() else None


def _image_of(job: dict[str, Any]) -> BuiltImage | None:
    described = (job.get("Meta") or {}).get(IMAGE_META)
    return BuiltImage.model_validate_json(described) if described else None


def _key_of_id(job_id: str, prefix: str) -> str | None:
    """The image key's first 12 characters in an item image's job id; None for the pool's own image."""
    key, dash, _ = job_id[len(prefix) :].rpartition("-")
    return key if dash else None


def _address(alloc: dict[str, Any]) -> str:
    """http://host:port of the allocation's `http` port (Nomad 1.x AllocatedResources, then the older Resources)."""
    shared = (alloc.get("AllocatedResources") or {}).get("Shared") or {}
    for port in shared.get("Ports") or []:
        if port.get("Label") == PORT_LABEL:
            return f"http://{port['HostIP']}:{port['Value']}"
    for network in [*(shared.get("Networks") or []), *((alloc.get("Resources") or {}).get("Networks") or [])]:
        for port in network.get("DynamicPorts") or []:
            if port.get("Label") == PORT_LABEL:
                return f"http://{network['IP']}:{port['Value']}"
    raise SandboxError(f"Nomad allocation {alloc.get('ID')} has no {PORT_LABEL!r} port")
