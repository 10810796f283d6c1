"""One settings object for the worker, the CLI and the tests.

Values come from, highest first: keyword arguments, environment variables
(`ROLLOUTS_` prefix, `__` between nested names, e.g. `ROLLOUTS_TEMPORAL__ADDRESS`),
then a TOML file (`rollouts.toml` in the working directory, or the path in
`ROLLOUTS_CONFIG`, which must exist), then the defaults below. Environment variables
are read once, when `Settings()` is built, never at import time. A relative `data_dir`
is taken from the config file's folder when a file is in use, else from the working
directory, and made absolute, so every command run against one config finds the same data.
Left unset, it does not move with the working directory either (`default_data_dir`).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, ValidationError, field_validator, model_validator
from pydantic_settings import (
    BaseSettings,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.inputs import describe_problem
from temporal_rollouts.core.records import MAX_BATCH_CONCURRENCY
from temporal_rollouts.core.sandbox_backends import LocalBackendConfig, SandboxBackendConfig
from temporal_rollouts.sandbox_server.config import ServerOptions
from temporal_rollouts.sandbox_server.schema import DEFAULT_LEASE_TTL_S, DEFAULT_MAX_ARCHIVE_BYTES

DEMO_POLICY = "demo"
CONFIG_FILE = "rollouts.toml"
DATA_FOLDER = ".rollouts"


def default_data_dir(config: Path | None) -> Path:
    """Where the data lives when `data_dir` is not set, the same from any working directory: beside the
    config file in use; else in the checkout the project runs from (an editable install, as `make demo`
    makes: each checkout its own data, its own server's database and its own store); else, for an
    installed package, the user's data home (`$XDG_DATA_HOME/temporal-rollouts`, by default
    `~/.local/share/temporal-rollouts`)."""
    if config is not None:
        return config.parent / DATA_FOLDER
    checkout = Path(__file__).resolve().parents[2]
    if (checkout / "pyproject.toml").is_file() and (checkout / "worker.py").is_file():
        return checkout / DATA_FOLDER
    home = os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share"
    return Path(home) / "temporal-rollouts"


def config_file() -> Path | None:
    """The config file in use: the one `ROLLOUTS_CONFIG` names (an error if it is missing), else
    `rollouts.toml` in the working directory when there is one."""
    named = os.environ.get("ROLLOUTS_CONFIG")
    if named:
        path = Path(named).expanduser()
        if not path.is_file():
            from temporal_rollouts.core.errors import ConfigError

            raise ConfigError(f"ROLLOUTS_CONFIG names {named!r}, which is not a file")
        return path.resolve()
    local = Path(CONFIG_FILE)
    return local.resolve() if local.is_file() else None


def is_file_module(module: str) -> bool:
    """Whether an `env_modules` entry is a file (a path, or a name ending in .py) rather than a module name."""
    return module.endswith(".py") or "/" in module


def _settings_problems(err: ValidationError, values: dict[str, Any]) -> str:
    """Each problem of a settings ValidationError with its key and its source (argument, variable or file)."""
    import tomllib

    try:
        path = config_file()
        in_file = tomllib.loads(path.read_text()) if path is not None else {}
    except (OSError, tomllib.TOMLDecodeError, ConfigError):
        path, in_file = None, {}
    lines = []
    for error in err.errors(include_url=False):
        loc = tuple(str(part) for part in error.get("loc", ()))
        top = loc[0] if loc else ""
        if top in values:
            source = "settings arguments"
        elif variable := _variable_of(loc):
            source = f"environment variable {variable}"
        elif path is not None and _has_key(in_file, loc):
            source = f"settings file {path}"
        else:
            source = "settings"
        lines.append(f"{source}: {describe_problem(error)}")
    return lines[0] if len(lines) == 1 else "bad settings:\n" + "\n".join(lines)


def _variable_of(loc: tuple[str, ...]) -> str | None:
    """The environment variable that set the key at `loc` (or the table holding it), as it is spelt."""
    names = {name.upper(): name for name in os.environ if name.upper().startswith("ROLLOUTS_")}
    for end in range(len(loc), 0, -1):
        if (name := names.get("ROLLOUTS_" + "__".join(loc[:end]).upper())) is not None:
            return name
    return None


def _has_key(table: Any, loc: tuple[str, ...]) -> bool:
    for part in loc:
        if not isinstance(table, dict) or part not in table:
            return False
        table = table[part]
    return bool(loc)


class TemporalSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: str | None = None
    """host:port of a Temporal frontend; unset means the embedded dev server."""
    namespace: str = "default"
    """Temporal namespace for every workflow."""
    task_queue: str = "rollouts"
    """Task queue the worker polls and batches are started on."""
    embedded_port: int = 7233
    """gRPC port of the embedded dev server."""
    embedded_ui_port: int = 8233
    """Web UI port of the embedded dev server."""
    ui_url: str | None = None
    """Web UI address to print when connecting to a non-embedded server."""
    tls: bool = False
    """Connect with TLS (implied by any of the tls_* files, or by `api_key_env`)."""
    tls_ca_file: Path | None = None
    """PEM file of the CA that signed the server's certificate; None trusts the system roots."""
    tls_client_cert_file: Path | None = None
    """PEM client certificate for mTLS (with `tls_client_key_file`)."""
    tls_client_key_file: Path | None = None
    """PEM private key of the mTLS client certificate."""
    tls_server_name: str | None = None
    """Server name to verify the certificate against, when it differs from the address's host."""
    api_key_env: str | None = None
    """Environment variable holding an API key (Temporal Cloud); the key never enters a workflow."""

    @model_validator(mode="after")
    def _client_cert_pair(self) -> TemporalSettings:
        if (self.tls_client_cert_file is None) != (self.tls_client_key_file is None):
            raise ValueError("temporal.tls_client_cert_file and temporal.tls_client_key_file go together (mTLS)")
        return self

    @property
    def uses_tls(self) -> bool:
        files = (self.tls_ca_file, self.tls_client_cert_file, self.tls_server_name)
        return self.tls or self.api_key_env is not None or any(value is not None for value in files)


class ChatPolicy(BaseModel):
    """An OpenAI-compatible chat endpoint that parses tool calls itself: for evaluation and SFT data."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["chat"] = "chat"
    """Chat completions with native tool calls (vLLM, SGLang, OpenAI, ...)."""
    base_url: str
    """OpenAI-compatible base URL, e.g. http://localhost:8000/v1."""
    model: str = "default"
    """Model name sent in each request."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key; the key never enters a workflow."""
    timeout_s: float = 300.0
    """Timeout of one model request."""
    max_connections: int = Field(default=256, ge=1)
    """Connections this worker keeps open to the endpoint (the model connection pool): requests past it wait for one; raise it with the rollouts a worker holds in flight."""
    tokenizer: str | None = None
    """For SFT data: a tokenizer (name or local folder) whose chat template renders each scored rollout into token ids and masks in the written groups; unset leaves them empty."""
    chat_template: str | None = None
    """A Jinja file used instead of the tokenizer's template when rendering for SFT."""


class GeneratePolicy(BaseModel):
    """Token-exact generation for RL training: token ids in, sampled ids and their logprobs out."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["sglang", "vllm"]
    """SGLang's native `/generate`, or the Atropos vLLM server's `/generate`."""
    base_url: str
    """Server root (a trailing /v1 is ignored), e.g. http://localhost:30000."""
    tokenizer: str
    """Tokenizer name or local folder; its chat template renders the conversation."""
    chat_template: str | None = None
    """A Jinja file used instead of the tokenizer's template (e.g. one that renders tools)."""
    tool_call_parser: str = "hermes"
    """How tool calls are read back from generated text (llm.parsers: hermes, qwen3_coder, llama3_json, ...)."""
    api_key_env: str | None = None
    """Name of the environment variable holding the API key; the key never enters a workflow."""
    timeout_s: float = 300.0
    """Timeout of one generation request."""
    max_connections: int = Field(default=256, ge=1)
    """Connections this worker keeps open to the endpoint (the model connection pool): requests past it wait for one; raise it with the rollouts a worker holds in flight."""
    prefill_from: str | None = None
    """Tests and demos only: a policy whose reply is forced (masked) at the start of each turn, to steer a model too small to choose tools."""


def _policy_type(value: Any) -> str:
    kind = value.get("type", "chat") if isinstance(value, dict) else getattr(value, "type", "chat")
    return "chat" if kind == "chat" else "generate"


PolicyEndpoint = Annotated[
    Annotated[ChatPolicy, Tag("chat")] | Annotated[GeneratePolicy, Tag("generate")],
    Discriminator(_policy_type),
]


class PoolOptions(BaseModel):
    """What the worker's pool of sandbox containers does with them (`SandboxPool` and its fleet take it whole)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    min_containers: int = Field(default=1, ge=0)
    """Containers kept running even when idle."""
    max_containers: int = Field(default=4, ge=1)
    """The pool starts another container when every slot is taken, up to this many."""
    max_containers_per_image: int | None = Field(default=None, ge=1)
    """Containers of one item image at most (`max_containers` still bounds them all together); unset: `max_containers`. Containers of an image are started when its rollouts find no free slot, and stopped like any idle container (`idle_stop_s`), or at once when another image needs the room."""
    idle_stop_s: float = 300.0
    """A container above `min_containers` whose slots were all free this long is stopped."""
    request_timeout_s: float = Field(default=30.0, gt=0)
    """How long the pool waits for a sandbox server to answer one request, beyond what the request itself may
    take (an acquire's wait, a command's timeout), before it counts the server unreachable."""

    @model_validator(mode="after")
    def _min_within_max(self) -> PoolOptions:
        if self.min_containers > self.max_containers:
            raise ValueError(f"min_containers ({self.min_containers}) exceeds max_containers ({self.max_containers})")
        return self

    @property
    def max_per_image(self) -> int:
        """The most containers of one item image: `max_containers_per_image`, within `max_containers`."""
        return min(self.max_containers_per_image or self.max_containers, self.max_containers)


class SandboxSettings(PoolOptions, ServerOptions):
    """The slot pool (`PoolOptions`), and what each of its sandbox servers starts with (`ServerOptions`, in
    `temporal_rollouts/sandbox_server/config.py`: slots per container, isolation, slot uids,
    `[sandbox.limits]`, cgroups, network, caps), which every backend passes to every server it starts.
    Each part is handed over whole: the backend holds these settings, the pool reads its own part."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    backend: SandboxBackendConfig = Field(default_factory=LocalBackendConfig)
    """Where sandbox containers run: `local`, `static`, `nomad` or `modal`, with that backend's own fields."""
    reap_interval_s: float = 30.0
    """Seconds between passes of the slot-pool maintenance workflow, which frees leases whose holder workflow has closed."""
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    """A slot lease not renewed for this long expires; longer than the longest step."""
    acquire_timeout_s: float = 600.0
    """How long a rollout waits for a free slot before it stops with `slot_unavailable`."""

    @model_validator(mode="before")
    @classmethod
    def _flat_local_fields(cls, data: Any) -> Any:
        """Older flat settings: `backend = "local"`, and `host`/`start_local` beside it, still work."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        backend = data.get("backend", {"type": "local"})
        if isinstance(backend, str):
            backend = {"type": backend}
        moved = {"host": "host", "start_local": "start_containers"}
        if any(old in data for old in moved):
            if not isinstance(backend, dict) or backend.get("type", "local") != "local":
                raise ValueError(
                    "sandbox.host and sandbox.start_local belong to the local backend: set sandbox.backend.*"
                )
            backend = {**backend, **{new: data.pop(old) for old, new in moved.items() if old in data}}
        data["backend"] = backend
        return data

    @model_validator(mode="after")
    def _modal_outlives_leases(self) -> SandboxSettings:
        backend = self.backend
        if backend.type == "modal" and backend.idle_timeout_s <= self.lease_ttl_s:
            raise ValueError(
                f"sandbox.backend.idle_timeout_s ({backend.idle_timeout_s}) must exceed sandbox.lease_ttl_s "
                f"({self.lease_ttl_s:g}): Modal would end sandboxes whose leases are still held"
            )
        return self

    @property
    def start_containers(self) -> bool:
        """Whether this process may start and restart containers (never for `static`)."""
        return bool(getattr(self.backend, "start_containers", False))


DEFAULT_MIRROR_HOSTS = ("deb.debian.org:80", "deb.debian.org:443", "pypi.org:443", "files.pythonhosted.org:443")


class ImageSettings(BaseModel):
    """Item images: where they are built and kept, and what a build may reach (docs/images.md)."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    store: Path | None = None
    """The image store (podman/buildah's containers-storage) of this worker's builds; `<data_dir>/images` when unset."""
    base_cache: Path | None = None
    """Where bootstrapped base images are kept as tars, shared by every data folder and CI run; `$XDG_CACHE_HOME/temporal-rollouts/base-images` (else `~/.cache/...`) when unset."""
    debian_mirror: str = "http://deb.debian.org/debian"
    """The Debian mirror `debian:bookworm-slim` is bootstrapped from (mmdebstrap), when the store lacks it."""
    build_timeout_s: float = Field(default=1800.0, gt=0)
    """How long one build may take, unless the item's image says otherwise."""
    max_concurrent_builds: int | None = Field(default=None, ge=1)
    """Builds at once on this host, by every worker process together (others wait their turn, heartbeating); the host's CPU count when unset."""
    build_network: Literal["mirror", "none", "host"] = "mirror"
    """What a build's RUN steps reach: `mirror` only `mirror_hosts` (through relays in a network namespace of the build's own: nothing else, not this host's services), `none` nothing, `host` everything this host reaches (trusted Dockerfiles only)."""
    mirror_hosts: list[str] = Field(default_factory=lambda: list(DEFAULT_MIRROR_HOSTS))
    """`host:port` pairs a build may reach with `build_network = "mirror"`: package mirrors."""
    registry: str | None = None
    """Where built images are pushed for backends whose hosts pull them (Nomad's docker driver), e.g. `registry.example.com:5000/rollouts`; unset: images stay in this worker's store."""
    registry_tls_verify: bool = True
    """Check the registry's TLS certificate when pushing (off only for a registry on a trusted network that speaks plain HTTP)."""


class DemoPolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_local: bool = True
    """Whether `python worker.py` starts the demo policy server when the default policy is `demo`."""
    host: str = "127.0.0.1"
    """Address the demo policy server binds."""
    port: int = 8765
    """Port of the demo policy server."""
    api_key_env: str | None = None
    """Name of the environment variable holding the demo policy's key (sent as a bearer token); a `host` beyond loopback needs one, or the server refuses to start."""
    harbor_tasks: list[str] = Field(default_factory=list)
    """Folders of Harbor tasks (or task folders), absolute paths, whose solutions the demo policy plays besides those of `examples/harbor` and the bundled envs, so that `rollouts batch --tasks PATH --policy demo` checks your own tasks end to end (docs/harbor.md)."""


class StorageSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["local", "s3"] = "local"
    """Where large payloads, transcripts and workspace snapshots live: a local folder, or S3 (MinIO)."""
    path: Path | None = None
    """Folder of the local store; `<data_dir>/storage` when unset."""
    bucket: str = "rollouts"
    """Bucket (S3), or the top folder inside `path` (local)."""
    endpoint_url: str | None = None
    """S3 endpoint, e.g. http://minio:9000; unset for AWS."""
    region: str | None = None
    """S3 region."""
    s3_addressing_style: Literal["path", "virtual", "auto"] | None = None
    """How S3 URLs name the bucket; None: "path" when `endpoint_url` is set (MinIO, moto), boto's "auto" on AWS."""
    payload_size_threshold: int = Field(default=8 * 1024, ge=0, le=1024 * 1024)
    """Workflow and activity payloads at least this large travel by reference, not in history."""
    max_snapshot_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES
    """A workspace snapshot larger than this is refused with an explained, non-retryable error."""
    cache_mib: int = Field(default=256, ge=1)
    """Memory a worker keeps for transcripts and for token traces read or written (each, estimated): every model turn reads its rollout's whole transcript, so a cache short of what the rollouts in flight hold sends each turn back to storage for all of it."""


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_concurrent_activities: int = 500
    """Activities one worker runs at once (they are I/O bound)."""
    max_concurrent_local_activities: int = 500
    """Local activities (tool calls) one worker runs at once; the SDK's default of 100 caps concurrent rollouts."""
    max_concurrent_workflow_tasks: int = 200
    """Workflow tasks one worker runs at once."""
    processes: int = Field(default=1, ge=1, le=256)
    """Worker processes `python worker.py` runs on this machine (one uses about one core): the first starts the local services and keeps the others running (runtime/worker_processes.py)."""
    slot_supplier: Literal["loop_lag", "fixed", "resource"] = "loop_lag"
    """How many tasks the worker takes at once, up to the max_concurrent_* counts: `loop_lag` takes another only while its event loop runs within max_loop_lag_s of time (runtime/loop_lag.py), so an overloaded worker leaves work waiting in Temporal's task queues instead of falling behind on it; `fixed` takes up to the counts whatever its load; `resource` is Temporal's resource-based tuner (the whole machine's CPU and memory under target_cpu and target_memory)."""
    max_loop_lag_s: float = Field(default=1.0, gt=0)
    """With `slot_supplier = "loop_lag"`: how late the worker's event loop may run before it takes no more tasks."""
    target_cpu: float = Field(default=0.85, gt=0, le=1)
    """With `slot_supplier = "resource"`: the machine's CPU use (0-1) past which the worker takes no more tasks."""
    target_memory: float = Field(default=0.8, gt=0, le=1)
    """With `slot_supplier = "resource"`: the machine's memory use (0-1) past which the worker takes no more tasks."""
    sticky_queue_timeout_s: float = Field(default=60.0, gt=0)
    """How long a rollout's next workflow task may wait for this worker (which holds the rollout in its cache) before any worker may take it with the whole history; the SDK's 10 s makes a busy worker replay the rollouts it fell behind on, which costs it more CPU. Tasks scheduled after a worker stops polling go to the shared queue at once (Temporal sees the sticky queue has no poller); only those already waiting on it wait this long."""
    max_cached_workflows: int = Field(default=4_096, ge=0)
    """Workflows one worker keeps in memory between their tasks (the SDK's sticky cache); a rollout evicted from it is replayed from its history on its next step. Keep it well above the workflows a worker holds in flight (rollouts, their batches, feeds): rollouts take turns, so a cache even a few short of them evicts the one due next and nearly every step replays (150 rollouts on a cache of 140 cost the worker 4x the CPU per step). Memory goes only to workflows in flight. `worker.metrics_address` shows its misses and forced evictions."""
    sandboxed_workflows: bool = False
    """Run workflow code in Temporal's workflow sandbox: it catches non-determinism but costs CPU on every workflow task."""
    graceful_shutdown_s: float = 30.0
    """On SIGTERM, how long running activities get to finish before they are handed back."""
    host_name: str | None = None
    """This host's name in worker identities (`pid@host`); the machine's hostname when unset."""
    versioning: bool = True
    """Temporal worker versioning (docs/upgrades.md): each worker serves one build of the workflow code, a batch or rollout finishes on the build it started on, and new ones go to the deployment's current build. Off, every worker takes every task, and a workflow change that is not replay-safe breaks the rollouts in flight."""
    build_id: str | None = Field(default=None, min_length=1, max_length=255)
    """This worker's build. Unset, it is a digest of the workflow code (comments and docstrings aside), so restarting workers whose workflows did not change keeps their build, and their rollouts go on; set it (a git commit, an image tag) to decide yourself."""
    become_current: Literal["if_newest", "never"] = "if_newest"
    """`if_newest`: a starting worker makes its build the current one when no build newer than it has polled yet, so upgrading is starting the new workers (an old worker that restarts never takes new work back). `never`: only `rollouts versions --set-current BUILD` (or `temporal worker deployment set-current-version`) moves new work to a build."""
    metrics_address: str | None = Field(default=None, pattern=r"^[^\s:]+:\d{1,5}$")
    """`host:port` where the worker serves the Temporal SDK's metrics for Prometheus at `/metrics` (sticky cache hits, misses and forced evictions, task latencies and slots); worker process k of `processes` serves on port + k - 1. Off when unset."""


class AtroposSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_url: str = "http://localhost:8000"
    """Atropos trajectory API (`run-api`) that batches with `sink: atropos` post their groups to."""
    timeout_s: float = 60.0
    """Timeout of one request to the trajectory API."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="ROLLOUTS_", env_nested_delimiter="__", extra="forbid")

    data_dir: Path = Path(DATA_FOLDER)
    """Where the embedded server's database, sandbox workspaces, results and logs live. Unset: `.rollouts` beside the config file in use, else in the checkout the project runs from, else `~/.local/share/temporal-rollouts`; never the working directory's (docs/configuration.md)."""
    max_batch_rollouts: int = Field(default=1_000_000, ge=1)
    """A batch of more rollouts (items x group size) than this is refused before it starts."""
    max_batch_concurrency: int = Field(default=2_000, ge=1, le=MAX_BATCH_CONCURRENCY)
    """A batch asking for more rollouts at once (`max_concurrency`) than this is refused before it starts; past what the workers and sandboxes can serve, more only queues in Temporal. Above 2,000 the Temporal server's own limits bind too: `limit.numPendingChildExecutions.error` (2,000 by default) refuses more children, and a batch whose history passes `limit.historyCount.suggestContinueAsNew` (4,096 events by default, 20,000 on the embedded server and in the compose stack; about 10 per rollout) stops starting rollouts until the running ones end and it continues as new; for more at once, raise those on the server or run several batches."""
    env_modules: Annotated[list[str], NoDecode] = Field(default_factory=list)
    """Modules whose envs this process loads besides the bundled ones and the installed packages' entry points (group `temporal_rollouts.envs`), for env code that is not packaged: module names on the import path, or `.py` files (relative to the config file's folder when a file is in use, else to the working directory). In `ROLLOUTS_ENV_MODULES`: comma-separated, or a JSON list. `--env-module` adds to them. Every worker, the CLI and the demo policy load the same list (docs/write-an-env.md)."""
    default_policy: str = DEMO_POLICY
    """Policy used when a batch names none: a name from `policies`, `demo`, or a base URL."""
    policies: dict[str, PolicyEndpoint] = Field(default_factory=dict)
    """Named model endpoints a batch may pick with `policy`."""
    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    demo_policy: DemoPolicySettings = Field(default_factory=DemoPolicySettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    images: ImageSettings = Field(default_factory=ImageSettings)
    atropos: AtroposSettings = Field(default_factory=AtroposSettings)

    def __init__(self, **values: Any) -> None:
        """As BaseSettings, but a bad value or unknown key is a ConfigError naming the key and where it came from."""
        try:
            super().__init__(**values)
        except ValidationError as err:
            raise ConfigError(_settings_problems(err, values)) from None

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        path = config_file()
        if path is None:
            return (init_settings, env_settings)
        return (init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=path))

    @field_validator("env_modules", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        """`a.b, c.py` from the environment, or a JSON list there, as every other list setting takes."""
        if isinstance(value, str) and value.lstrip().startswith("["):
            try:
                return json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError("neither a JSON list nor names separated by commas") from err
        if isinstance(value, str):
            return [part.strip() for part in value.split(",") if part.strip()]
        return value

    @model_validator(mode="after")
    def _absolute_data_dir(self) -> Settings:
        path = config_file()
        if "data_dir" not in self.model_fields_set:
            self.data_dir = default_data_dir(path).resolve()
        elif not self.data_dir.is_absolute():
            self.data_dir = ((path.parent if path else Path.cwd()) / self.data_dir).resolve()
        return self

    @model_validator(mode="after")
    def _absolute_env_module_files(self) -> Settings:
        """A relative env module file is taken from the config file's folder (else the working directory) and
        made absolute, so the processes this one starts (the demo policy, more workers) find the same file."""
        path = config_file()
        base = path.parent if path else Path.cwd()
        self.env_modules = [str((base / m).resolve()) if is_file_module(m) else m for m in self.env_modules]
        return self

    @property
    def embedded(self) -> bool:
        return self.temporal.address is None

    @property
    def temporal_address(self) -> str:
        return self.temporal.address or f"127.0.0.1:{self.temporal.embedded_port}"

    @property
    def ui_url(self) -> str | None:
        if self.embedded:
            return f"http://127.0.0.1:{self.temporal.embedded_ui_port}"
        return self.temporal.ui_url

    @property
    def results_dir(self) -> Path:
        return self.data_dir / "results"

    @property
    def image_store(self) -> Path:
        return self.images.store or self.data_dir / "images"

    @property
    def storage_path(self) -> Path:
        return self.storage.path or self.data_dir / "storage"

    @property
    def demo_policy_url(self) -> str:
        return f"http://{self.demo_policy.host}:{self.demo_policy.port}/v1"

    def policy_endpoint(self, policy: str | None) -> ChatPolicy | GeneratePolicy:
        """Resolve a policy name or URL to an endpoint, in the worker (never in a workflow)."""
        name = policy or self.default_policy
        if name in self.policies:
            return self.policies[name]
        if name == DEMO_POLICY:
            demo = self.demo_policy
            return ChatPolicy(
                base_url=self.demo_policy_url, model="demo-policy", timeout_s=60.0, api_key_env=demo.api_key_env
            )
        if name.startswith(("http://", "https://")):
            return ChatPolicy(base_url=name.rstrip("/"))
        known = sorted({DEMO_POLICY, *self.policies})
        raise ConfigError(f"unknown policy {name!r}: use a base URL or one of {known}")
