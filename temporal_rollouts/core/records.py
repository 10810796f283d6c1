"""The inputs and results of batches and trajectories: what users send and what they get back.

Plain pydantic models, so `temporal workflow start --input '{...}'` and the UI's start
form take plain JSON, and every field but `env` has a default.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from temporal_rollouts.core import defaults
from temporal_rollouts.core.harness import HarnessRecord, HarnessSpec, named_harness
from temporal_rollouts.core.forks import BranchPlan, BranchRecord, BranchSpec, ForkOrigin, ForkSpec
from temporal_rollouts.core.refs import TokenTraceRef, TranscriptRef
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.core.tool_stats import ToolCallOutcome, ToolErrorRecord, ToolStats  # noqa: F401  (re-exported)
from temporal_rollouts.sandbox_server.schema import DEFAULT_COMMAND_TIMEOUT_S


class StopReason(StrEnum):
    """Why a rollout stopped. The first group are the model's doing and get scored;
    the rest are failures of the machinery, and such a rollout ends as a failed workflow."""

    COMPLETED = "completed"
    MAX_TURNS = "max_turns"
    MAX_TOOL_CALLS = "max_tool_calls"
    WALL_CLOCK = "wall_clock"
    CONTEXT_BUDGET = "context_budget"
    MALFORMED_REPLY = "malformed_reply"

    MODEL_UNAVAILABLE = "model_unavailable"
    MODEL_REJECTED = "model_rejected"
    SLOT_UNAVAILABLE = "slot_unavailable"
    SANDBOX_ERROR = "sandbox_error"
    BAD_ITEM = "bad_item"
    IMAGE_BUILD_FAILED = "image_build_failed"
    ENV_ERROR = "env_error"
    CONFIG_ERROR = "config_error"
    FORK_DIVERGED = "fork_diverged"
    HARNESS_FAILED = "harness_failed"
    CANCELLED = "cancelled"
    TERMINATED = "terminated"
    TIMED_OUT = "timed_out"

    @property
    def scored(self) -> bool:
        return self in _SCORED


_SCORED = {
    StopReason.COMPLETED,
    StopReason.MAX_TURNS,
    StopReason.MAX_TOOL_CALLS,
    StopReason.WALL_CLOCK,
    StopReason.CONTEXT_BUDGET,
    StopReason.MALFORMED_REPLY,
}


class RolloutLimits(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(
        default=defaults.MAX_TURNS, ge=1, description="Model turns before the rollout stops (max_agent_turns)."
    )
    max_tool_calls: int = Field(default=100, ge=0, description="Tool calls before the rollout stops.")
    wall_clock_s: float = Field(default=1800.0, gt=0, description="Budget from the first model turn to the last.")
    context_tokens: int = Field(
        default=32_768,
        gt=0,
        description="Context budget of one model turn: old tool results are shortened, then the oldest middle "
        "turns dropped, to fit; the rollout stops only when even that cannot fit.",
    )
    command_timeout_s: float = Field(
        default=DEFAULT_COMMAND_TIMEOUT_S, gt=0, description="Default timeout of one terminal command."
    )


class Sampling(BaseModel):
    model_config = ConfigDict(extra="forbid")

    temperature: float = Field(default=1.0, ge=0, description="agent_temperature")
    max_tokens: int | None = Field(default=None, ge=1, description="Per-turn generation cap.")


MAX_GROUP_SIZE = 1024
"""Rollouts of one item run side by side (a group is scored together), so a group is bounded."""
MAX_ITEM_OFFSET = 10**12
"""No task set is this large; an offset past it is a typo, never a silent wrap."""
MAX_BATCH_CONCURRENCY = 100_000
"""The most `max_concurrency` any worker may allow (settings max_batch_concurrency sets the working limit)."""
MAX_START_RATE = 10_000.0
"""Rollouts a batch may start per second at most, when it paces its starts (`start_rate`)."""


class BatchInput(BaseModel):
    """A batch as a user types it. Bounds that need the worker's settings (`max_batch_rollouts`,
    the env's size, the results folder) are checked by the batch's first steps."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field(description="Registered env name, e.g. terminal_tasks.")
    num_items: int = Field(
        default=defaults.BATCH_ITEMS,
        ge=1,
        description="Items in the batch; items x group size is capped by settings max_batch_rollouts.",
    )
    group_size: int = Field(default=defaults.BATCH_GROUP_SIZE, ge=1, le=MAX_GROUP_SIZE)
    item_offset: int = Field(
        default=defaults.BATCH_ITEM_OFFSET,
        ge=0,
        le=MAX_ITEM_OFFSET,
        description="Index of the first item in the env's task set; must lie inside it.",
    )
    cycle_items: bool = Field(
        default=False,
        description="Go round the env's task set again when num_items runs past its end; "
        "without it such a batch is refused, so no task is repeated by accident.",
    )
    policy: str | None = Field(default=None, description="Policy name or base URL; the worker's default when unset.")
    tool_call_parser: str | None = Field(
        default=None, description="Overrides the token-level policy's tool-call parser."
    )
    env_config: dict[str, Any] = Field(default_factory=dict)
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    sampling: Sampling = Field(default_factory=Sampling)
    max_concurrency: int = Field(
        default=defaults.BATCH_MAX_CONCURRENCY,
        ge=1,
        le=MAX_BATCH_CONCURRENCY,
        description="Trajectories running at once; capped by settings max_batch_concurrency.",
    )
    start_rate: float = Field(
        default=defaults.BATCH_START_RATE,
        ge=0,
        le=MAX_START_RATE,
        allow_inf_nan=False,
        description="Rollouts started per second at most; 0 starts them as fast as the batch's workflow task allows. "
        "Spreads a large first wave, so its model turns and sandbox setups do not all arrive at once.",
    )
    output: str | None = Field(
        default=None,
        description="JSONL file for scored groups, inside the results folder (a relative name is taken "
        "relative to it); results/<batch id>.jsonl when unset.",
    )
    sink: Literal["jsonl", "atropos"] = Field(
        default="jsonl", description="Also post each group to the Atropos trajectory API (settings atropos.api_url)."
    )
    max_token_length: int = Field(
        default=0,
        ge=0,
        description="Cut token sequences from the end to this length; 0 keeps them whole "
        "(the atropos sink then uses the trainer's max_token_len).",
    )
    resume: bool = Field(
        default=False, description="Gather an earlier run of this batch again, resuming its failed rollouts."
    )
    branch: BranchSpec | None = Field(
        default=None,
        description="Branch every rollout at these turns into `factor` siblings that share its prefix "
        "(an item's group is then its whole tree).",
    )
    snapshot_turns: bool = Field(
        default=False,
        description="Save each rollout's workspace after every turn, so a "
        "later fork restores it instead of replaying tool calls.",
    )
    harness: HarnessSpec | None = Field(
        default=None,
        description="Run this agent harness in each slot instead of our loop: `minimal`, `mini-swe-agent`, or a "
        "spec (command, requirements); the env's own harness when unset, if it names one.",
    )
    cursor: BatchCursor | None = Field(default=None, description="Internal: where a continued-as-new run picks up.")

    @field_validator("harness", mode="before")
    @classmethod
    def _harness_by_name(cls, value: object) -> object:
        return named_harness(value)  # type: ignore[arg-type]

    @model_validator(mode="after")
    def _harness_alone(self) -> BatchInput:
        if self.harness is not None and (self.branch is not None or self.snapshot_turns):
            raise ValueError("harness: a harness's rollouts cannot branch or snapshot turns (they need our own loop)")
        return self

    @model_validator(mode="after")
    def _tree_fits(self) -> BatchInput:
        if self.branch is not None and self.branch.tree_size(self.group_size) > MAX_GROUP_SIZE:
            raise ValueError(
                f"branch: group_size x factor^len(at_turns) = {self.branch.tree_size(self.group_size)} "
                f"rollouts per item, over {MAX_GROUP_SIZE}"
            )
        return self


class TrajectoryInput(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env: str
    item: Item
    env_config: dict[str, Any] = Field(default_factory=dict)
    policy: str | None = None
    tool_call_parser: str | None = None
    allow_network: bool = False
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    sampling: Sampling = Field(default_factory=Sampling)
    batch_id: str | None = None
    group_index: int = 0
    resume_from_run: str | None = Field(
        default=None, description="Run id of a failed run of this rollout to continue from, with its workspace."
    )
    notify: str | None = Field(
        default=None, description="Workflow id told when the rollout ends (signal `rollout_finished`): a training feed."
    )
    trainer_api: str | None = Field(
        default=None,
        description="Unused: a turn's policy version is only ever what the model server reports (activities/llm.py "
        "`numeric_version`). Kept so that recorded inputs, which carry it, still parse.",
    )
    fork: ForkSpec | None = Field(default=None, description="Begin with another rollout's first turns and workspace.")
    branch: BranchPlan | None = Field(default=None, description="Branch at these turns; the tree starts the siblings.")
    snapshot_turns: bool = Field(default=False, description="Save the workspace after every turn (for later forks).")
    harness: HarnessSpec | None = Field(default=None, description="Run this harness as the agent instead of our loop.")

    def narrowed_by_item(self) -> TrajectoryInput:
        """This input with the item's own agent timeout (`Item.timeouts`) as its wall clock, where shorter."""
        agent_s = self.item.timeouts.agent_s if self.item.timeouts is not None else None
        if agent_s is None or agent_s >= self.limits.wall_clock_s:
            return self
        return self.model_copy(update={"limits": self.limits.model_copy(update={"wall_clock_s": agent_s})})

    @model_validator(mode="after")
    def _harness_alone(self) -> TrajectoryInput:
        if self.harness is not None and (self.fork is not None or self.branch is not None or self.snapshot_turns):
            raise ValueError(
                "harness: a harness's rollout cannot fork, branch or snapshot turns (they need our own loop)"
            )
        return self

    @field_validator("harness", mode="before")
    @classmethod
    def _harness_by_name(cls, value: object) -> object:
        return named_harness(value)  # type: ignore[arg-type]


class PendingCalls(BaseModel):
    """Tool calls of the last model turn that have not run yet."""

    assistant: str = Field(description="Transcript key of the assistant message holding the calls.")
    count: int
    next_index: int = 0


class TrajectoryResult(BaseModel):
    rollout_id: str
    env: str
    item_id: str
    group_index: int = 0
    score: float = 0.0
    stop_reason: StopReason
    stop_detail: str = ""
    turns: int = 0
    tool_calls: int = 0
    tool_errors: list[ToolErrorRecord] = Field(default_factory=list)
    tool_stats: ToolStats = Field(
        default_factory=ToolStats, description="Calls attempted, schema-valid, run ok, failed."
    )
    timings: dict[str, float] = Field(
        default_factory=dict, description="Seconds per phase: acquire, setup, llm, tools, verify, total."
    )
    verify_details: dict[str, Any] = Field(default_factory=dict)
    transcript: TranscriptRef | None = Field(default=None, description="The conversation, stored once per message.")
    setup_meta: dict[str, Any] = Field(
        default_factory=dict, description="What the env's workspace setup returned, for its verifier."
    )
    tokens: TokenTraceRef | None = Field(default=None, description="Token ids and logprobs, for token-level policies.")
    pending: PendingCalls | None = None
    agent_stop: StopReason | None = Field(default=None, description="Why the model's part ended, once it has.")
    agent_stop_detail: str = ""
    snapshot: str | None = Field(default=None, description="Object key of the workspace saved when the rollout failed.")
    resumed_from_run: str | None = None
    run_id: str | None = Field(default=None, description="The run that produced this result.")
    policy_versions: list[int | None] = Field(
        default_factory=list, description="Per model turn, the version of the weights that produced it (None: unknown)."
    )
    completion_tokens: int = Field(
        default=0,
        description="Tokens the model generated for this rollout: a fork's "
        "prefix, taken over and not generated again, is not counted.",
    )
    fork: ForkOrigin | None = Field(default=None, description="The rollout and turn this one was forked from.")
    branches: list[BranchRecord] = Field(default_factory=list, description="Where this rollout branched, into which.")
    image: str | None = Field(
        default=None, description="The image its slot ran on (its name in the store); None: the server's own root."
    )
    harness: HarnessRecord | None = Field(
        default=None, description="The harness that ran as the agent: its calls, exit status and output's tail."
    )

    def version_range(self) -> tuple[int, int] | None:
        """(oldest, newest) known policy version of the rollout's turns."""
        known = [v for v in self.policy_versions if v is not None]
        return (min(known), max(known)) if known else None

    @property
    def failed(self) -> bool:
        return not self.stop_reason.scored


ROLLOUT_FINISHED = "rollout_finished"
"""The signal a rollout started with `notify` sends that workflow when it ends, carrying its TrajectoryResult."""
ROLLOUT_FAILED = "RolloutFailed"
"""Type of the ApplicationError a failed rollout ends with; its first detail is the TrajectoryResult."""


def failed_rollout_result(cause: BaseException | None) -> TrajectoryResult | None:
    """The TrajectoryResult a failed rollout carried in its failure, if that is what `cause` is."""
    from temporalio.exceptions import ApplicationError

    if isinstance(cause, ApplicationError) and cause.type == ROLLOUT_FAILED and cause.details:
        return TrajectoryResult.model_validate(cause.details[0])
    return None


STOP_DETAILS = "For each way rollouts failed, why the first of them stopped (e.g. the model server's answer)."
MAX_STOP_DETAIL_CHARS = 500
DISTINCT_ITEMS = (
    "Items of the task set the batch ran: fewer than `items` when it went round the set again (cycle_items)."
)


class BatchProgress(BaseModel):
    batch_id: str
    env: str
    total: int
    completed: int = 0
    failed: int = 0
    running: int = 0
    resumed: int = 0
    groups_written: int = 0
    groups_pending: int = 0
    score_sum: float = 0.0
    stop_reasons: dict[str, int] = Field(default_factory=dict)
    stop_details: dict[str, str] = Field(default_factory=dict, description=STOP_DETAILS)
    items: int | None = None
    distinct_items: int | None = Field(default=None, description=DISTINCT_ITEMS)
    output: str | None = None
    done: bool = False

    @property
    def mean_score(self) -> float | None:
        return self.score_sum / self.completed if self.completed else None

    def count(self, result: TrajectoryResult) -> None:
        """Count a finished rollout: scored or failed, its stop reason, and why the first of its kind failed."""
        reason = result.stop_reason.value
        if result.failed:
            self.failed += 1
            self.stop_details.setdefault(reason, result.stop_detail[:MAX_STOP_DETAIL_CHARS])
        else:
            self.completed += 1
            self.score_sum += result.score
        self.stop_reasons[reason] = self.stop_reasons.get(reason, 0) + 1


class BatchResult(BaseModel):
    batch_id: str
    env: str
    total: int
    completed: int
    failed: int
    mean_score: float | None
    stop_reasons: dict[str, int]
    stop_details: dict[str, str] = Field(default_factory=dict, description=STOP_DETAILS)
    items: int | None = None
    distinct_items: int | None = Field(default=None, description=DISTINCT_ITEMS)
    output: str | None
    groups_written: int
    groups_pending: int = Field(
        default=0, description="Groups held back because a member failed; `rollouts resume` completes them."
    )
    resumed: int = 0


class BatchCursor(BaseModel):
    """A batch's state carried across continue-as-new: where it is, never the items themselves
    (they are read again by page). A cursor from before paging also held `items`; it is ignored."""

    model_config = ConfigDict(extra="ignore")

    next_item: int = Field(ge=0)
    progress: BatchProgress
    allow_network: bool


BatchInput.model_rebuild()
