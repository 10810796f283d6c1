"""One settings object for the worker, the CLI and the tests.

Values come from, highest first: keyword arguments, environment variables
(`ROLLOUTS_` prefix, `__` between nested names, e.g. `ROLLOUTS_TEMPORAL__ADDRESS`),
then a TOML file (`rollouts.toml` in the working directory, or the path in
`ROLLOUTS_CONFIG`, which must exist), then the defaults below. Environment variables
are read once, when `Settings()` is built, never at import time. A relative `data_dir`
is taken from the config file's folder when a file is in use, else from the working
directory, and made absolute, so every command run against one config finds the same data.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from temporal_rollouts.sandbox_server.schema import (
    DEFAULT_LEASE_TTL_S,
    DEFAULT_MAX_ARCHIVE_BYTES,
    DEFAULT_MAX_OUTPUT_CHARS,
)

DEMO_POLICY = "demo"
CONFIG_FILE = "rollouts.toml"


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
    prefill_from: str | None = None
    """Tests and demos only: a policy whose reply is forced (masked) at the start of each turn, to steer a model too small to choose tools."""


def _policy_type(value: Any) -> str:
    kind = value.get("type", "chat") if isinstance(value, dict) else getattr(value, "type", "chat")
    return "chat" if kind == "chat" else "generate"


PolicyEndpoint = Annotated[
    Annotated[ChatPolicy, Tag("chat")] | Annotated[GeneratePolicy, Tag("generate")],
    Discriminator(_policy_type),
]


class SandboxSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    backend: Literal["local"] = "local"
    """Where sandbox containers run."""
    start_local: bool = True
    """Whether `python worker.py` starts the local sandbox container when none is running."""
    slots_per_container: int = 8
    """Isolated workspaces served by one sandbox server."""
    min_containers: int = 1
    """Containers kept running even when idle."""
    max_containers: int = 4
    """The pool starts another container when every slot is taken, up to this many."""
    idle_stop_s: float = 300.0
    """A container above `min_containers` whose slots were all free this long is stopped."""
    reap_interval_s: float = 30.0
    """Seconds between passes of the slot-pool maintenance workflow, which frees leases whose holder workflow has closed."""
    host: str = "127.0.0.1"
    """Address the local sandbox server binds."""
    require_isolation: bool = False
    """Refuse to run commands when bubblewrap is missing, instead of warning and running unisolated."""
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    """A slot lease not renewed for this long expires; longer than the longest step."""
    acquire_timeout_s: float = 600.0
    """How long a rollout waits for a free slot before it stops with `slot_unavailable`."""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    """Tool output longer than this is cut, keeping head and tail."""


class DemoPolicySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    start_local: bool = True
    """Whether `python worker.py` starts the demo policy server when the default policy is `demo`."""
    host: str = "127.0.0.1"
    """Address the demo policy server binds."""
    port: int = 8765
    """Port of the demo policy server."""


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
    payload_size_threshold: int = Field(default=8 * 1024, ge=0, le=1024 * 1024)
    """Workflow and activity payloads at least this large travel by reference, not in history."""
    max_snapshot_bytes: int = DEFAULT_MAX_ARCHIVE_BYTES
    """A workspace snapshot larger than this is refused with an explained, non-retryable error."""


class WorkerSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_concurrent_activities: int = 500
    """Activities one worker runs at once (they are I/O bound)."""
    max_concurrent_local_activities: int = 500
    """Local activities (tool calls) one worker runs at once; the SDK's default of 100 caps concurrent rollouts."""
    max_concurrent_workflow_tasks: int = 200
    """Workflow tasks one worker runs at once."""
    sandboxed_workflows: bool = False
    """Run workflow code in Temporal's workflow sandbox: it catches non-determinism but costs CPU on every workflow task."""
    graceful_shutdown_s: float = 30.0
    """On SIGTERM, how long running activities get to finish before they are handed back."""


class AtroposSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    api_url: str = "http://localhost:8000"
    """Atropos trajectory API (`run-api`) that batches with `sink: atropos` post their groups to."""
    timeout_s: float = 60.0
    """Timeout of one request to the trajectory API."""


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ROLLOUTS_", env_nested_delimiter="__", extra="forbid"
    )

    data_dir: Path = Path(".rollouts")
    """Where the embedded server's database, sandbox workspaces, results and logs live."""
    default_policy: str = DEMO_POLICY
    """Policy used when a batch names none: a name from `policies`, `demo`, or a base URL."""
    policies: dict[str, PolicyEndpoint] = Field(default_factory=dict)
    """Named model endpoints a batch may pick with `policy`."""
    temporal: TemporalSettings = Field(default_factory=TemporalSettings)
    sandbox: SandboxSettings = Field(default_factory=SandboxSettings)
    demo_policy: DemoPolicySettings = Field(default_factory=DemoPolicySettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    storage: StorageSettings = Field(default_factory=StorageSettings)
    atropos: AtroposSettings = Field(default_factory=AtroposSettings)

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

    @model_validator(mode="after")
    def _absolute_data_dir(self) -> Settings:
        if not self.data_dir.is_absolute():
            path = config_file()
            self.data_dir = ((path.parent if path else Path.cwd()) / self.data_dir).resolve()
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
    def storage_path(self) -> Path:
        return self.storage.path or self.data_dir / "storage"

    @property
    def demo_policy_url(self) -> str:
        return f"http://{self.demo_policy.host}:{self.demo_policy.port}/v1"

    def policy_endpoint(self, policy: str | None) -> ChatPolicy | GeneratePolicy:
        """Resolve a policy name or URL to an endpoint, in the worker (never in a workflow)."""
        from temporal_rollouts.core.errors import ConfigError

        name = policy or self.default_policy
        if name in self.policies:
            return self.policies[name]
        if name == DEMO_POLICY:
            return ChatPolicy(base_url=self.demo_policy_url, model="demo-policy", timeout_s=60.0)
        if name.startswith(("http://", "https://")):
            return ChatPolicy(base_url=name.rstrip("/"))
        known = sorted({DEMO_POLICY, *self.policies})
        raise ConfigError(f"unknown policy {name!r}: use a base URL or one of {known}")
