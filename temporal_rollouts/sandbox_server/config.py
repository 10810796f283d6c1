"""Everything a sandbox server starts with, in one model that writes and reads its own command line.

Every way a server is started (the local backend's detached process, a Nomad job with raw_exec
or docker, a Modal sandbox, the compose file, a user's own `python -m
temporal_rollouts.sandbox_server`) goes through `ServerConfig.argv()` and is read back by
`ServerConfig.from_argv()`, so a setting can never reach one backend and miss another.

`ServerOptions` is what every container of a pool shares: its slot count, isolation, the uid
range its slots claim uids from, the per-slot limits, cgroups, network, the output and transfer
caps and the lease sweep. The worker's sandbox settings are ServerOptions (they add the pool's
own fields); a backend adds this container's folder and name (`ContainerConfig`, what its
SlotManager is built from) and where it listens and how it finds its token (`ServerConfig`,
`ServerOptions.for_container`). Each object takes its config whole: nothing copies its fields.

`SlotLimits` is the only spelling of the eight per-slot limits: in settings, on the command
line (flattened: `--memory-limit-mb`), in `/slots/limits` requests (`SlotLimitsRequest`, the
same fields, each optional) and in an env's `sandbox_limits`.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, create_model, model_validator

MIB = 1024 * 1024
DEFAULT_UID_BASE = 60000
DEFAULT_UID_COUNT = 5000
DEFAULT_UID_CLAIMS = Path("/run/temporal-rollouts/slot-uids")
DEFAULT_MAX_OUTPUT_CHARS = 50_000
"""Tool output longer than this is cut, keeping head and tail (settings: sandbox.max_output_chars)."""
DEFAULT_MAX_TRANSFER_BYTES = 1024 * 1024 * 1024
"""An upload or download larger than this is refused (settings: sandbox.max_transfer_bytes)."""
DEFAULT_MAX_PACK_S = 300.0
"""A folder that takes longer to pack for a download fails it (settings: sandbox.max_pack_s)."""


class SlotLimits(BaseModel):
    """What one slot may use, in the units people write; 0 turns a limit off."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    memory_limit_mb: int = Field(default=2048, ge=0)
    """Memory of one slot, its processes together (cgroup; without one, the server's watchdog adds them up,
    and RLIMIT_AS caps each process); 0 turns it off."""
    max_processes: int = Field(default=256, ge=0)
    """Processes of one slot (cgroup pids, else RLIMIT_NPROC of the slot's own uid); 0 turns it off."""
    cpus: float = Field(default=1.0, ge=0)
    """CPU share of one slot (cgroup cpu quota; without one, the watchdog pauses a slot past it); 0 turns it off."""
    cpu_time_limit_s: int = Field(default=600, ge=0)
    """CPU seconds each process of a command may use (RLIMIT_CPU); 0 turns it off."""
    file_size_limit_mb: int = Field(default=1024, ge=0)
    """Largest file a command may write (RLIMIT_FSIZE); 0 turns it off."""
    tmp_limit_mb: int = Field(default=256, ge=0)
    """Size of the private /tmp tmpfs of each command (counts as the slot's memory); 0 leaves it unsized."""
    disk_limit_mb: int = Field(default=4096, ge=0)
    """Workspace size: the size of the slot's own filesystem where the server can mount one, else checked
    (`slot_volume`); the slot's processes are stopped at it."""
    max_files: int = Field(default=262_144, ge=0)
    """Files, folders and links the workspace may hold: its filesystem's inodes (a small disk limit caps
    them at one per 4 KiB), else counted by the check; 0 turns it off."""

    @classmethod
    def off(cls) -> SlotLimits:
        return cls(**{name: 0 for name in cls.model_fields})

    @property
    def memory_bytes(self) -> int:
        return self.memory_limit_mb * MIB

    @property
    def file_size_bytes(self) -> int:
        return self.file_size_limit_mb * MIB

    @property
    def tmp_bytes(self) -> int:
        return self.tmp_limit_mb * MIB

    @property
    def disk_bytes(self) -> int:
        return self.disk_limit_mb * MIB

    def narrowed(self, request: SlotLimitsRequest | None) -> SlotLimits:
        """These limits, each lowered to the requested one: a request can set a limit that is off here,
        but never raise or turn off one that is on."""
        if request is None:
            return self
        values = {}
        for name, mine in self.model_dump().items():
            wanted = getattr(request, name)
            values[name] = mine if not wanted else wanted if not mine else min(mine, wanted)
        return SlotLimits(**values)


SlotLimitsRequest = create_model(  # the same fields, each optional: unset keeps the server's limit
    "SlotLimitsRequest",
    __config__=ConfigDict(extra="forbid"),
    __doc__="Limits for one lease (`SlotLimits` fields, each optional); they can only narrow the server's.",
    **{name: (field.annotation | None, Field(default=None, ge=0)) for name, field in SlotLimits.model_fields.items()},
)


class ServerOptions(BaseModel):
    """What every sandbox server of a pool starts with."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    slots_per_container: int = Field(default=8, ge=1)
    """Isolated workspaces served by one sandbox server."""
    require_isolation: bool = True
    """Refuse to run commands when bubblewrap is missing. Set to false to run them UNISOLATED on the host
    instead (development only): the server then warns on every start."""
    slot_uid_base: int = Field(default=DEFAULT_UID_BASE, ge=1000)
    """A sandbox server run as root runs each slot as its own unprivileged uid, claimed from
    `slot_uid_base` .. `slot_uid_base + slot_uid_count - 1`: no two slots on one host share one."""
    slot_uid_count: int = Field(default=DEFAULT_UID_COUNT, ge=1)
    """How many uids the servers of one host share; at least the slots that run there at once."""
    uid_claims_dir: Path = DEFAULT_UID_CLAIMS
    """Where the servers of one host claim their slots' uids (one lock file each, held while they run).
    Every root-run server on a host must see the same folder: containers mount the host's."""
    limits: SlotLimits = Field(default_factory=SlotLimits)
    """What one slot may use (`[sandbox.limits]`; the older flat names, `sandbox.memory_limit_mb`, still work);
    an env may narrow them for its own leases."""
    use_cgroups: bool = True
    """Enforce memory, processes and cpus with cgroups where the host delegates them (v1 or v2); false, or a
    host without delegation, falls back to the watchdog and rlimits. /health says which."""
    allow_network_unprotected: bool = False
    """Network-on slots share the sandbox host's network and can reach the control plane (Temporal,
    sandbox servers, storage, policy servers): the server refuses them unless this is set."""
    max_output_chars: int = Field(default=DEFAULT_MAX_OUTPUT_CHARS, gt=0)
    """Tool output longer than this is cut, keeping head and tail."""
    max_transfer_bytes: int = Field(default=DEFAULT_MAX_TRANSFER_BYTES, gt=0)
    """Largest file or packed folder moved into or out of a slot in one transfer (1 GiB)."""
    max_pack_s: float = Field(default=DEFAULT_MAX_PACK_S, gt=0)
    """Longest a folder may take to pack for a download (a snapshot, a fork's copy): past it the download fails
    with that reason and the slot is free again, whatever the agent left in it."""
    slot_volume: Literal["auto", "loop", "checked"] = "auto"
    """Where each slot's files live: `loop`, a filesystem of its own sized to its limits (root and loop devices);
    `checked`, a folder on the data folder's disk whose size is checked by walking it; `auto`, the first that
    works here. /health says which."""
    sweep_interval_s: float = Field(default=2.0, gt=0)
    """Seconds between a server's sweeps for leases that lapsed (not renewed within their ttl)."""

    @model_validator(mode="before")
    @classmethod
    def _flat_limits(cls, data: Any) -> Any:
        """Older flat settings (`sandbox.memory_limit_mb = 512`) still work: they move into `limits`."""
        if not isinstance(data, dict) or not any(name in data for name in SlotLimits.model_fields):
            return data
        data = dict(data)
        limits = data.get("limits", {})
        limits = dict(limits.model_dump() if isinstance(limits, SlotLimits) else limits)
        for name in SlotLimits.model_fields:
            if name in data:
                limits[name] = data.pop(name)
        data["limits"] = limits
        return data

    def options(self) -> ServerOptions:
        """Just the server options (settings carry more)."""
        return ServerOptions(**{name: getattr(self, name) for name in ServerOptions.model_fields})

    def for_container(self, **container: Any) -> ServerConfig:
        """The whole config of one container: these options and where it runs (`ServerConfig` fields)."""
        return ServerConfig(**self.options().model_dump(), **container)


class ContainerConfig(ServerOptions):
    """One container's slots, as its SlotManager holds them: the pool's options, and this container's
    own folder, name and item image."""

    root: Path
    """Slot workspaces, journals and logs live here."""
    container_id: str = "local"
    results_kept: int = Field(default=10_000, ge=1)
    """Stored results kept for answering a retried call id from its first run (the oldest go first)."""
    image_layers: list[Path] = Field(default_factory=list)
    """The item image its slots run on, as the host's image store keeps it: its layer folders, topmost first
    (`files/image_root`); none: slots run on this server's own root."""
    image_workdir: str = "/"
    """The image's WORKDIR: where the slots' commands start."""
    image_env: list[str] = Field(default_factory=list)
    """The image's ENV, `NAME=value` each: the slots' commands' environment (its PATH above all)."""
    image_name: str | None = None
    """The image's name, for /health and the logs."""


class ServerConfig(ContainerConfig):
    """One sandbox server: its container's slots (`ContainerConfig`), and where it listens and how it
    finds its token."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, description="0 picks a free port")
    token_file: Path | None = None
    """The file holding the bearer token; or `token_env`, a variable holding it (dropped once read)."""
    token_env: str | None = None
    allowed_hosts: list[str] = Field(default_factory=list)
    """Other names the server is reached by (a tunnel, a service name); '.example.com' for subdomains."""
    ready_file: Path | None = None
    """Written as JSON {url, pid, container_id} once it listens."""

    @model_validator(mode="after")
    def _one_token_source(self) -> ServerConfig:
        if (self.token_file is None) == (self.token_env is None):
            raise ValueError(
                "give the bearer token with exactly one of token_file (--token-file) and token_env (--token-env)"
            )
        return self

    def argv(self, **placeholders: str) -> list[str]:
        """The command line (after `python -m temporal_rollouts.sandbox_server`) that starts this server:
        every option written out, so no server ever falls back to a default it was not given.
        `placeholders` write a field as given, for a scheduler to fill in (`port="${NOMAD_PORT_http}"`)."""
        values = self.model_dump()
        values.update(values.pop("limits"))
        values.update(placeholders)
        argv: list[str] = []
        for name, value in values.items():
            flag = FLAGS.get(name, "--" + name.replace("_", "-"))
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + flag[2:])
            elif isinstance(value, list):
                for item in value:
                    argv += [flag, str(item)]
            elif value is not None:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def from_argv(cls, argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> ServerConfig:
        """Read a command line written by `argv()` (or by hand). Options it does not give come from
        `environ`'s `ROLLOUTS_SANDBOX__*` variables, the workers' own settings (a server started by
        something else, as in compose, reads the very variables its workers read), else the defaults."""
        parser = argparse.ArgumentParser(
            prog="python -m temporal_rollouts.sandbox_server",
            description="A sandbox server: one container's slots over HTTP.",
            argument_default=argparse.SUPPRESS,
        )
        limit_names = set(SlotLimits.model_fields)
        for model in (cls, SlotLimits):
            for name, field in model.model_fields.items():
                if name == "limits":
                    continue
                flag = FLAGS.get(name, "--" + name.replace("_", "-"))
                names = [flag, *ALIASES.get(name, [])]
                kind = field.annotation
                help_text = (field.description or "").strip() or None
                if kind is bool:
                    parser.add_argument(*names, dest=name, action=argparse.BooleanOptionalAction, help=help_text)
                elif name in LIST_FIELDS:
                    parser.add_argument(*names, dest=name, action="append", help=help_text)
                else:
                    parser.add_argument(*names, dest=name, help=help_text)
        parsed = vars(parser.parse_args(argv))
        given = options_from_environment(environ or {})
        limits = {**given.pop("limits", {}), **{name: parsed.pop(name) for name in list(parsed) if name in limit_names}}
        try:
            return cls(**{**given, **parsed}, limits=limits)
        except ValueError as err:
            parser.error(str(err))
            raise  # parser.error exits


def options_from_environment(environ: Mapping[str, str]) -> dict[str, Any]:
    """The server options among `ROLLOUTS_SANDBOX__*` variables (nested with `__`, as the settings
    read them); the pool's other settings and everything else are left out."""
    options: dict[str, Any] = {}
    for key, value in environ.items():
        if not key.startswith(ENV_PREFIX):
            continue
        path = key[len(ENV_PREFIX) :].lower().split("__")
        if path[0] in SlotLimits.model_fields and len(path) == 1:
            path = ["limits", path[0]]  # the older flat names
        if path[0] not in ServerOptions.model_fields or (path[0] == "limits") != (len(path) == 2):
            continue
        target = options.setdefault("limits", {}) if len(path) == 2 else options
        target[path[-1]] = value
    return options


ENV_PREFIX = "ROLLOUTS_SANDBOX__"
FLAGS = {"allowed_hosts": "--allowed-host", "slots_per_container": "--slots", "image_layers": "--image-layer"}
"""Flags that are not their field's name with dashes."""
LIST_FIELDS = ("allowed_hosts", "image_layers", "image_env")
"""Fields given as a flag repeated once per item."""
ALIASES = {"use_cgroups": ["--cgroups"], "sweep_interval_s": ["--sweep-interval"]}
"""Older spellings, still read."""
