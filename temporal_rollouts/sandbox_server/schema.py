"""Request and response models of the sandbox server.

Shared by the in-process slot manager, the HTTP server that wraps it and the
HTTP client, so the three cannot drift apart.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from temporal_rollouts.sandbox_server.config import (  # noqa: F401  (shared names, re-exported)
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_MAX_TRANSFER_BYTES,
    SlotLimits,
    SlotLimitsRequest,
)

DEFAULT_LEASE_TTL_S = 1800.0
"""A lease not renewed for this long lapses (settings: sandbox.lease_ttl_s)."""
DEFAULT_COMMAND_TIMEOUT_S = 60.0
"""A command that names no timeout is killed after this (limits.command_timeout_s)."""
DEFAULT_MAX_ARCHIVE_BYTES = 256 * 1024 * 1024
"""A workspace snapshot larger than this is refused (settings: storage.max_snapshot_bytes)."""
DEFAULT_SESSION_TIMEOUT_S = 180.0
"""How long a stateful terminal command may run before the call returns (the command keeps the session)."""


class Holder(BaseModel):
    """Who holds a slot: the workflow execution that leased it."""

    workflow_id: str
    run_id: str = ""


class SlotRef(BaseModel):
    """What a slot operation must present: which slot, under which lease."""

    container_id: str
    slot: int
    lease_id: str


class SlotLease(SlotRef):
    """Proof that a slot is leased, and to whom."""

    holder: Holder
    expires_at: float = Field(description="Unix time at which the lease lapses unless renewed.")

    def ref(self) -> SlotRef:
        return SlotRef(container_id=self.container_id, slot=self.slot, lease_id=self.lease_id)


class AcquireRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    holder: Holder
    ttl_s: float = DEFAULT_LEASE_TTL_S
    wait_s: float = Field(default=30.0, description="How long to wait, first come first served, for a free slot.")
    allow_network: bool = False
    ticket: str | None = Field(
        default=None, description="Names this request's place in line, so `POST /slots/withdraw` can take it back."
    )


class WithdrawRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ticket: str


class WithdrawResult(BaseModel):
    withdrawn: bool = Field(description="True when the ticket was still waiting in line and has now left it.")


class DrainRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    idle_s: float = Field(description="Drain only if no slot has had a lease or a waiter for this long.")


class DrainResult(BaseModel):
    draining: bool = Field(description="True when the server now refuses new leases and may be stopped.")
    idle_since: float | None = None


class LeaseRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    slot: int
    lease_id: str


class RenewRequest(LeaseRequest):
    ttl_s: float = DEFAULT_LEASE_TTL_S


class NarrowRequest(LeaseRequest):
    limits: SlotLimitsRequest


class CopyRequest(LeaseRequest):
    """`POST /slots/copy`: replace this slot's workspace with a copy of another slot's in the same container,
    both leased by the caller (a branch of a rollout starts from its parent's files without a round trip)."""

    source_slot: int
    source_lease_id: str
    max_bytes: int = Field(default=DEFAULT_MAX_ARCHIVE_BYTES, gt=0, description="Refuse a workspace larger than this.")


class ReleaseRequest(LeaseRequest):
    reset: bool = Field(
        default=True, description="Ignored: a released slot is always emptied, so the next holder starts clean."
    )
    reason: Literal["released", "reaped"] = Field(
        default="released", description="`reaped` when the reaper frees the lease of a closed workflow."
    )


class ReleaseResult(BaseModel):
    released: bool = Field(description="False when the lease was already gone (released, expired or reaped).")


class ExecOp(BaseModel):
    op: Literal["exec"] = "exec"
    command: str
    timeout_s: float = DEFAULT_COMMAND_TIMEOUT_S
    cache: list[str] = Field(
        default_factory=list,
        description="Entries of the container's shared cache this one command sees, read-only, at "
        "/cache/<name> (also $SANDBOX_CACHE/<name>); no other command of the slot sees them.",
    )
    resident: bool = Field(
        default=False,
        description="Fork the command from the slot's resident launcher, which the lease's first such command "
        "starts in the slot's sandbox, instead of building a sandbox for it alone: the same uid, limits, "
        "mounts and network, about a tenth of the cost, but the lease's resident commands share /tmp and "
        "see each other's processes while they run. An agent's tool calls set it; setup and verify hooks do "
        "not, so a verifier never sees what the agent left in /tmp. Ignored with `cache` or `read_only`.",
    )
    read_only: bool = Field(
        default=False,
        description="Mount the workspace read-only for this command: a check that observes the workspace, "
        "run beside the agent's programs it starts, sees it as the agent left it (nothing it runs can write, "
        "chmod or restore a file there). Refused where commands run unisolated.",
    )
    verifier: VerifierMounts | None = Field(
        default=None,
        description="Run as a verifier with folders of its own (`VerifierMounts`); its output folder's files "
        "come back in `ToolOutput.collected`. Refused where commands run unisolated.",
    )


CACHE_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"
MOUNT_PATH_PATTERN = r"^(/[A-Za-z0-9_][A-Za-z0-9._-]{0,63}){1,8}$"
"""Where a verifier's folders go inside the slot: an absolute path of plain names (no `.`, `..` or links)."""
COLLECTED_NAME_PATTERN = r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,63}$"
MAX_COLLECTED_BYTES = 64 * 1024
"""A collected file larger than this is not read back (a reward is a number or a small JSON object)."""
RESERVED_MOUNTS = ("/proc", "/dev", "/tmp", "/cache", "/run/rollouts")


class VerifierMounts(BaseModel):
    """What one verifier command gets of its own, after the agent is done (a Harbor task's `tests/test.sh`).

    `tests` (an entry of the container's cache, see `files.cache`) is bound read-only at `tests_at`, so
    nothing the tests run can change them; a fresh empty folder of the server's is bound writable at
    `output_at`, and after the command the server itself reads back the files named in `collect` (regular
    files only, never through a link, at most `MAX_COLLECTED_BYTES` each), so a verdict is never parsed out
    of output that the code under test can print too. `pristine` (a slot on an item image): the command
    runs on the image as it was built, under a writable layer of its own, with only the agent's WORKDIR
    carried over: what the agent changed elsewhere (PATH, interpreters, site-packages, /etc) is not there.
    On the server's own root every system folder is read-only to a slot already, so it changes nothing."""

    model_config = ConfigDict(extra="forbid")

    tests: str | None = Field(default=None, pattern=CACHE_NAME_PATTERN)
    tests_at: str = Field(default="/tests", pattern=MOUNT_PATH_PATTERN)
    output_at: str = Field(default="/logs/verifier", pattern=MOUNT_PATH_PATTERN)
    collect: list[str] = Field(default_factory=lambda: ["reward.txt", "reward.json"], max_length=16)
    pristine: bool = False

    @field_validator("collect")
    @classmethod
    def _plain_names(cls, names: list[str]) -> list[str]:
        for name in names:
            if not re.match(COLLECTED_NAME_PATTERN, name):
                raise ValueError(f"collect: {name!r} is not a plain file name")
        return names

    @model_validator(mode="after")
    def _apart(self) -> VerifierMounts:
        for path in (self.tests_at, self.output_at):
            if any(path == reserved or path.startswith(reserved + "/") for reserved in RESERVED_MOUNTS):
                raise ValueError(f"{path} is the sandbox's own ({', '.join(RESERVED_MOUNTS)} are)")
        a, b = self.tests_at + "/", self.output_at + "/"
        if a.startswith(b) or b.startswith(a):
            raise ValueError(f"tests_at {self.tests_at} and output_at {self.output_at} must not contain each other")
        return self


class CollectedFile(BaseModel):
    """One file a verifier command left in its output folder, as the server read it."""

    text: str | None = Field(default=None, description="Its content (UTF-8, bad bytes replaced), when readable.")
    problem: str | None = Field(default=None, description="Why it was not read: not a regular file, too large.")


class ReadFileOp(BaseModel):
    op: Literal["read_file"] = "read_file"
    path: str


class WriteFileOp(BaseModel):
    op: Literal["write_file"] = "write_file"
    path: str
    content: str


class SearchOp(BaseModel):
    op: Literal["search"] = "search"
    pattern: str
    path: str = "."
    max_matches: int = 200
    resident: bool = Field(
        default=False,
        description="Run grep from the slot's resident launcher, as the agent's terminal calls run (its own "
        "search tool); False: in a sandbox of its own, as a hook's search, which never sees the agent's /tmp.",
    )


class StopProcessesOp(BaseModel):
    """End every process of the slot: its stateful terminal, its resident launcher, whatever is left in its
    cgroups and, where the slot has a uid of its own, every process of that uid. A verifier asks for it
    before it checks, so no program of the agent can change or watch the workspace while it does."""

    op: Literal["stop_processes"] = "stop_processes"


SessionAction = Literal["start", "run", "send_keys", "screen", "read", "stop"]


class SessionOp(BaseModel):
    """The slot's stateful terminal: one shell whose directory, variables and background processes last.

    `run` types `text` as a command and waits for it to finish (up to `timeout_s`), answering its
    output and exit code; `send_keys` types `text` as keys and answers what the screen printed
    within `timeout_s`; `screen` shows the last lines; `read` the output since the last read."""

    op: Literal["session"] = "session"
    action: SessionAction
    text: str = ""
    timeout_s: float = DEFAULT_SESSION_TIMEOUT_S


Operation = Annotated[
    ExecOp | ReadFileOp | WriteFileOp | SearchOp | SessionOp | StopProcessesOp, Field(discriminator="op")
]


class ExecuteRequest(LeaseRequest):
    call_id: str = Field(description="Unique per tool call; a repeated id is answered from the stored result.")
    operation: Operation


class ToolOutput(BaseModel):
    call_id: str
    ok: bool
    output: str
    exit_code: int | None = None
    timed_out: bool = False
    truncated: bool = False
    duration_s: float = 0.0
    replayed: bool = Field(
        default=False, description="True when answered from the stored result of an earlier attempt."
    )
    collected: dict[str, CollectedFile] = Field(
        default_factory=dict, description="A verifier command's output files (`VerifierMounts.collect`) that exist."
    )
    verifier_root: Literal["pristine", "shared"] | None = Field(
        default=None,
        description="A verifier command's root: `pristine`, the image as built (or the server's read-only system "
        "folders) with the agent's working folder; `shared`, the root the agent changed.",
    )


TransferFormat = Literal["file", "tar", "tar.gz"]


class TransferQuery(LeaseRequest):
    """Query parameters of `PUT /files` and `GET /files`: the body is the file's bytes or a tar stream."""

    path: str = Field(description="Workspace path (relative, or absolute under /workspace) to write or read.")
    format: TransferFormat = Field(
        default="file", description="`file`: the body is the file's bytes; `tar`/`tar.gz`: a folder as a tar stream."
    )
    max_bytes: int = Field(default=DEFAULT_MAX_TRANSFER_BYTES, gt=0, description="Refuse payloads larger than this.")
    replace: bool = Field(default=False, description="Upload of a folder: empty the target folder first.")
    whole: bool = Field(
        default=False,
        description="The slot's whole state, for a snapshot and its restore: its workspace, or on an item image "
        "its writable layer (deletions of the image's files included); `path` is then ignored.",
    )


class CacheQuery(BaseModel):
    """Query parameters of `GET /cache` and `PUT /cache` (whose body is the entry as a tar.gz)."""

    name: str = Field(pattern=CACHE_NAME_PATTERN, description="The entry's name; by convention it names its content.")
    max_bytes: int = Field(default=DEFAULT_MAX_TRANSFER_BYTES, gt=0, description="Refuse payloads larger than this.")


class CacheEntry(BaseModel):
    """One entry of a container's shared, read-only cache."""

    name: str
    present: bool = Field(description="Whether the container holds the entry (after a put: always).")
    created: bool = Field(default=False, description="This put made it; False: it was there already.")
    bytes: int = Field(default=0, description="Bytes this put received (0 when it was there already).")


class TransferResult(BaseModel):
    path: str = Field(description="The path as the sandbox sees it.")
    bytes: int = Field(description="Bytes that crossed the wire.")
    entries: int = Field(default=1, description="Files, folders and links written (1 for a file).")


class ListQuery(LeaseRequest):
    path: str = "."
    max_entries: int = Field(default=1000, gt=0)


class FileEntry(BaseModel):
    path: str = Field(description="Relative to the listed folder.")
    kind: Literal["file", "dir", "link", "other"]
    size: int


class FileListing(BaseModel):
    path: str
    entries: list[FileEntry]
    truncated: bool = False


class SlotState(BaseModel):
    slot: int
    lease: SlotLease | None = None
    busy: bool = False
    quarantined: str | None = Field(
        default=None, description="Why the slot could not be reset; it is not leased until a reset succeeds."
    )


class HealthStatus(BaseModel):
    status: Literal["ok"] = "ok"
    container_id: str
    slots: int
    free: int
    waiters: int
    isolation: Literal["bubblewrap", "none"]
    idle_since: float | None = Field(
        default=None, description="Unix time since when no slot has had a lease or a waiter; None while busy."
    )
    draining: bool = Field(default=False, description="True once drained for a stop: new leases are refused.")
    require_isolation: bool = Field(default=True, description="False when commands may run unisolated.")
    quarantined: dict[int, str] = Field(
        default_factory=dict, description="Slots that could not be reset, with why; they are never leased."
    )
    limits: dict[str, str] = Field(
        default_factory=dict,
        description="Each per-slot limit (uid, memory, processes, cpus, cpu_time, file_size, tmp, disk, files, "
        "wall_time, setuid_bits) and the mechanism enforcing it here, or `off`.",
    )
    not_held: dict[str, str] = Field(
        default_factory=dict,
        description="Limits this server cannot hold whole, each with what escapes it (no cgroup, no filesystem "
        "per slot); empty when every limit in force is held.",
    )
    network: str = Field(default="refused", description="What a network-on slot gets on this server.")
    image: str | None = Field(
        default=None,
        description="The item image the slots run on (each with its own writable layer); None: the server's own root.",
    )
    slot_limits: SlotLimits | None = Field(default=None, description="The values of the server's per-slot limits.")
    slot_uids: dict[int, int] = Field(
        default_factory=dict, description="The uid each slot claimed on this host (a root-run server; else empty)."
    )
    uid_range: tuple[int, int] | None = Field(
        default=None, description="First and last uid this server's slots may claim (a root-run server)."
    )


LeaseEventKind = Literal["queued", "granted", "released", "expired", "withdrawn", "reaped"]


class LeaseEvent(BaseModel):
    """One line of a server's `leases.jsonl`: what happened to a slot or a place in line, and when."""

    t: float = Field(description="Unix time of the event.")
    event: LeaseEventKind
    slot: int | None = None
    lease_id: str | None = None
    holder: Holder | None = None
    waiters: int = Field(description="Requests waiting in line after the event.")
    free: int = Field(description="Slots without a lease after the event (a slot being reset counts as free).")
    handed_over: bool = Field(
        default=False, description="A release, expiry or reap whose slot went straight to a waiter."
    )
    reason: str | None = Field(default=None, description="Why a waiter left: withdrawn, disconnected, timeout, ...")


HARNESS_WAIT_S = 60.0
"""The longest a `POST /harness/next` waits for the harness's next request before it answers empty."""
HARNESS_TAIL_CHARS = 2000
"""The end of a harness's stdout and of its stderr that its exit keeps, each, unless the start asks for less."""


class HarnessExit(BaseModel):
    """How a harness process ended, as the server saw it."""

    exit_code: int | None = Field(default=None, description="Its exit status; negative: the signal that ended it.")
    stopped: bool = Field(default=False, description="Stopped by `POST /harness/stop` (a limit), not ended on its own.")
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def failed(self) -> bool:
        """It ended on its own with a failure status: the harness broke, not the model's attempt."""
        return not self.stopped and self.exit_code != 0


class HarnessStartRequest(LeaseRequest):
    """`POST /harness/start`: run `command` in the slot as its agent, with a model endpoint of its own. A start
    of the `harness_id` already running (or ended) in the slot answers its state instead: a retried start
    never starts a second harness."""

    harness_id: str = Field(min_length=1, max_length=256, description="The rollout's run: one harness per run.")
    command: str = Field(min_length=1, description="Run with bash in the workspace, as the agent.")
    env: dict[str, str] = Field(default_factory=dict, description="More environment variables for the command.")
    bundle: str | None = Field(
        default=None,
        pattern=CACHE_NAME_PATTERN,
        description="A cache entry holding the harness's packages: bound read-only, on PYTHONPATH and PATH.",
    )
    task: str = Field(description="The task, written to the file $ROLLOUTS_TASK_FILE names.")
    model: str = Field(
        default="policy", max_length=128, description="The model name the harness is told ($ROLLOUTS_MODEL)."
    )
    tail_chars: int = Field(default=HARNESS_TAIL_CHARS, ge=0, le=65536)


class HarnessRef(LeaseRequest):
    harness_id: str = Field(min_length=1, max_length=256)


class HarnessState(BaseModel):
    harness_id: str
    started: bool = Field(default=False, description="This request started it (False: it was there already).")
    running: bool
    exit: HarnessExit | None = None


class HarnessNextRequest(HarnessRef):
    """`POST /harness/next`: the harness's oldest request not yet answered, waiting up to `wait_s` for one. The
    same request is returned until it is answered, so a retried take loses nothing."""

    wait_s: float = Field(default=30.0, ge=0, le=HARNESS_WAIT_S)


class PendingModelRequest(BaseModel):
    request_id: str
    body: dict = Field(description="The chat-completions request as the harness sent it (parsed JSON).")


class HarnessNext(BaseModel):
    request: PendingModelRequest | None = None
    exit: HarnessExit | None = Field(default=None, description="Set once the harness has ended and nothing is pending.")


class HarnessAnswerRequest(HarnessRef):
    """`POST /harness/answer`: the answer to one request; answering it again changes nothing."""

    request_id: str
    status: int = Field(default=200, ge=200, le=599)
    body: dict


class HarnessStopRequest(HarnessRef):
    """`POST /harness/stop`: end the harness and everything it started (a limit of the rollout was reached)."""


class HarnessAnswered(BaseModel):
    delivered: bool = Field(description="False when the request was answered before or its caller had gone.")
