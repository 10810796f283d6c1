"""Where sandbox containers run: one config class per backend, and their tagged union.

`sandbox.backend` in the settings is one of these, chosen by its `type`. Each
class holds only what its backend needs; what every pool shares (min/max
containers, lease TTL; `PoolOptions`) and what every server starts with (slots
per container, limits; `ServerOptions`) stays on `SandboxSettings`. Secrets
are never values here, only the names of environment variables that hold them,
so a config can be logged, stored and put in a workflow without leaking one.
The backends themselves live in `temporal_rollouts.sandbox.backends.<type>`.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_SECRET_ENV = "ROLLOUTS_SANDBOX_SECRET"


class LocalBackendConfig(BaseModel):
    """Sandbox servers as detached processes on this machine (one host)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["local"] = "local"
    """Processes on this host, found through a registry file under `data_dir`."""
    host: str = "127.0.0.1"
    """Address the local sandbox servers bind."""
    start_containers: bool = True
    """Whether this worker starts (and restarts) sandbox servers; off means it only uses running ones."""
    start_timeout_s: float = Field(default=30.0, gt=0)
    """How long a started sandbox server may take to answer before starting it failed."""


class StaticServer(BaseModel):
    model_config = ConfigDict(extra="forbid")

    container_id: str = Field(min_length=1)
    """The id the server was started with (`--container-id`); its token is derived from it."""
    url: str = Field(pattern=r"^https?://")
    """Base URL of the sandbox server, e.g. http://sandbox-0.sandbox:8080."""


class StaticBackendConfig(BaseModel):
    """A fixed set of sandbox servers that something else runs (Kubernetes, the compose stack)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["static"] = "static"
    """The configured servers are the whole pool; nothing is started or stopped."""
    servers: list[StaticServer] = Field(min_length=1)
    """The sandbox servers, each with its container id and URL."""
    secret_env: str = DEFAULT_SECRET_ENV
    """Environment variable holding the pool secret; each server's token is HMAC(secret, container_id)."""


class NomadBackendConfig(BaseModel):
    """Sandbox servers as Nomad jobs, one job per container index, driven through python-nomad."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["nomad"] = "nomad"
    """Nomad jobs named `<job_prefix>-<index>`; the job name is the lock that stops a second start."""
    address: str = "http://localhost:4646"
    """Nomad HTTP API address (the original's `nomad_address`)."""
    token_env: str | None = "NOMAD_TOKEN"
    """Environment variable holding the Nomad ACL token, sent as X-Nomad-Token; None for no ACLs."""
    job_prefix: str = Field(default="rollouts-sandbox", pattern=r"^[a-z0-9][a-z0-9-]*$")
    """Job ids are `<job_prefix>-<index>` (the original's `sandbox_job_id`)."""
    datacenter: str = "dc1"
    """Datacenter the jobs are placed in."""
    namespace: str | None = None
    """Nomad namespace of the jobs; None for the agent's default."""
    region: str | None = None
    """Nomad region; None for the agent's own."""
    driver: Literal["raw_exec", "docker"] = "raw_exec"
    """raw_exec runs the server package with a Python on the client node; docker runs `image`."""
    python: str = "python3"
    """raw_exec: the interpreter on the client nodes that runs `-m temporal_rollouts.sandbox_server`."""
    pythonpath: str | None = None
    """raw_exec: PYTHONPATH on the client nodes where the server package lives; None when it is installed."""
    image: str = "rollouts-sandbox:local"
    """docker: the image built from docker/sandbox.Dockerfile (the original's `sandbox_image`)."""
    privileged: bool = False
    """docker: run the container privileged (bubblewrap inside some runtimes needs it)."""
    share_uid_claims: bool = True
    """docker: bind the host's slot uid claims folder (`uid_claims_dir`) into each container, so the servers of one host never give two slots one uid (a shared process limit and shared files). Needs the Nomad client's docker plugin `volumes { enabled = true }`; turn it off only where one sandbox container runs per host."""
    cpu: int = Field(default=500, gt=0)
    """CPU per sandbox server, MHz."""
    memory: int = Field(default=512, gt=0)
    """Memory per sandbox server, MB."""
    purge_job_on_start: bool = False
    """At worker start, purge this pool's jobs that have no running allocation (stuck in restart backoff)."""
    purge_job_on_shutdown: bool = True
    """`rollouts server stop` purges the jobs (else only stops them, keeping their history in Nomad)."""
    start_containers: bool = True
    """Whether this worker registers new jobs when the pool needs more containers."""
    start_timeout_s: float = Field(default=120.0, gt=0)
    """How long a new job gets to have a running allocation that answers /health."""
    secret_env: str = DEFAULT_SECRET_ENV
    """Environment variable holding the pool secret; tokens reach jobs through Nomad Variables."""


class ModalBackendConfig(BaseModel):
    """Sandbox servers as Modal Sandboxes, one named sandbox per container index."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["modal"] = "modal"
    """Modal Sandboxes named `<app_name>-<index>`; Modal refuses a second live sandbox of one name."""
    app_name: str = "rollouts-sandbox"
    """Modal app the sandboxes belong to; also the name prefix and the `pool` tag."""
    image: str = "python:3.11"
    """Registry image the sandboxes run; the sandbox server package is added on top of it."""
    gpu: str | None = None
    """GPU type, e.g. "A10G"; None for none."""
    cpu: float = Field(default=1.0, gt=0)
    """CPU cores per sandbox."""
    memory: int = Field(default=2048, gt=0)
    """Memory per sandbox, MiB."""
    idle_timeout_s: int = Field(default=2400, gt=0)
    """Modal ends a sandbox idle this long; must exceed the lease TTL (checked), unlike the original's 120."""
    max_lifetime_s: int = Field(default=3600, gt=0)
    """Modal's hard lifetime of one sandbox; the pool drains a sandbox before it ends."""
    drain_margin_s: int = Field(default=900, ge=0)
    """A sandbox this close to its lifetime takes no new leases, so running rollouts finish first."""
    secrets: list[str] = Field(default_factory=list)
    """Names of Modal Secrets mounted into every sandbox (the original's comma-separated `modal_secrets`)."""
    env_vars: dict[str, str] = Field(default_factory=dict)
    """Plain environment variables for every sandbox (the original's "K=V;K2=V2" `modal_env_vars`)."""
    workspace_base: str = "/data"
    """Folder inside the sandbox holding slot workspaces, journals and logs."""
    port: int = 8080
    """Port the sandbox server listens on inside the sandbox, reached through an encrypted tunnel."""
    start_containers: bool = True
    """Whether this worker creates new sandboxes when the pool needs more containers."""
    start_timeout_s: float = Field(default=300.0, gt=0)
    """How long a new sandbox gets to answer /health through its tunnel."""
    secret_env: str = DEFAULT_SECRET_ENV
    """Environment variable holding the pool secret; tokens reach sandboxes as Modal Secrets."""


SandboxBackendConfig = Annotated[
    LocalBackendConfig | StaticBackendConfig | NomadBackendConfig | ModalBackendConfig,
    Field(discriminator="type"),
]
"""One of the backend configs, picked by `type`."""

REMOTE_BACKENDS = ("static", "nomad", "modal")
"""Backends whose containers any worker host can reach: the backend, not a local file, is the registry."""
