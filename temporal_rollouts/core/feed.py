"""A training run: what a user starts it with, and what it carries and counts.

A batch is finite; a training run is not. One `TrainingFeedWorkflow` per run (its id is the
run's name) owns the cursor over items, the groups in flight and where finished groups go: the
trainer door (numbered, acknowledged batches a trainer pulls; `core/door.py`), Atropos'
`run-api`, or a JSONL file. It paces new groups by the trainer's progress (`max_staleness`).
These models are its input, its state across continue-as-new and the figures its `status`
query answers.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from temporal_rollouts.core import defaults
from temporal_rollouts.core.records import (
    MAX_GROUP_SIZE,
    MAX_ITEM_OFFSET,
    RolloutLimits,
    Sampling,
    StopReason,
    TrajectoryResult,
)
from temporal_rollouts.core.door import DoorFigures, DoorGroup, DoorLedger, StaleGroups
from temporal_rollouts.core.forks import BranchSpec
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.core.trees import RolloutTreeResult


RETRIED_STOPS = frozenset(
    {
        StopReason.MODEL_UNAVAILABLE,
        StopReason.SLOT_UNAVAILABLE,
        StopReason.SANDBOX_ERROR,
        StopReason.ENV_ERROR,
        StopReason.TERMINATED,
        StopReason.TIMED_OUT,
    }
)
"""Machinery failures a feed finishes by resuming the rollout; other failures (a bad item, a config
error, a 4xx from the model, a cancel) would fail again the same way and give the group up at once."""


class FeedInput(BaseModel):
    """A training run as a user types it: every field but `env` has a default."""

    model_config = ConfigDict(extra="forbid")

    env: str = Field(description="Registered env name, e.g. terminal_tasks.")
    env_config: dict[str, Any] = Field(default_factory=dict)
    policy: str | None = Field(default=None, description="A token-level policy, or a chat policy with a tokenizer.")
    tokenizer: str | None = Field(
        default=None,
        description="For a chat policy that names no tokenizer: one (a name or a folder on the workers) whose chat "
        "template renders the groups' token ids and masks (the Atropos env's --env.tokenizer_name).",
    )
    tool_call_parser: str | None = None
    group_size: int = Field(default=defaults.FEED_GROUP_SIZE, ge=1, le=MAX_GROUP_SIZE)
    item_offset: int = Field(default=0, ge=0, le=MAX_ITEM_OFFSET, description="First item of the env's task set.")
    cycle_items: bool = Field(default=True, description="Start again at the first item once the task set is used up.")
    limits: RolloutLimits = Field(default_factory=RolloutLimits)
    sampling: Sampling = Field(default_factory=Sampling)
    max_groups_in_flight: int = Field(
        default=defaults.FEED_GROUPS_IN_FLIGHT, ge=1, le=4096, description="Groups whose rollouts run at once."
    )
    max_staleness: int = Field(
        default=defaults.FEED_MAX_STALENESS,
        ge=0,
        description="Trainer steps a posted token may lag behind the trainer: a group starts only "
        "while the groups ahead of it fit in that many steps' batches.",
    )
    stale_groups: StaleGroups = Field(
        default=StaleGroups(defaults.FEED_STALE_GROUPS),
        description="What happens to a group staler than the bound when it would reach the trainer: handed "
        "over marked (post), marked with its stale rollouts masked (scores_only), dropped, or its item started "
        "again (requeue, the door only).",
    )
    max_retries: int = Field(
        default=defaults.FEED_MAX_RETRIES,
        ge=0,
        description="Runs after the first a rollout gets for machinery failures.",
    )
    retry_backoff_s: float = Field(
        default=10.0,
        ge=0,
        description="Wait before resuming a failed rollout, doubled each time (at most 5 minutes): "
        "a model server that is down for a minute is waited out, not raced.",
    )
    max_groups: int = Field(
        default=defaults.FEED_MAX_GROUPS, ge=0, description="Stop after posting this many groups; 0 runs until stopped."
    )
    sink: Literal["door", "atropos", "jsonl"] = Field(
        default=defaults.FEED_SINK,
        description="Where finished groups go: the trainer door (batches a trainer takes and acknowledges), "
        "run-api, or `output` (SFT data, `process`).",
    )
    batch_size: int = Field(
        default=defaults.FEED_BATCH_SIZE,
        ge=0,
        le=1_000_000,
        description="The door: sequences in one trainer batch (whole groups); 0: the first trainer to register says.",
    )
    output: str | None = Field(default=None, description="The JSONL file (in the results folder) for `sink: jsonl`.")
    api_url: str | None = Field(default=None, description="run-api; the workers' settings atropos.api_url when unset.")
    max_token_length: int = Field(
        default=0, ge=0, description="Cut sequences to this; 0: below the trainer's max_token_len."
    )
    branch: BranchSpec | None = Field(
        default=None,
        description="Branch every rollout at these turns into `factor` siblings: a group is then one "
        "tree (RolloutTreeWorkflow), posted with its tree, resumed as a whole.",
    )
    env_weight: float = Field(default=1.0, gt=0, description="This env's weight in run-api's batches.")
    state: FeedState | None = Field(default=None, description="Internal: where a continued-as-new run picks up.")

    @model_validator(mode="after")
    def _requeue_needs_the_door(self) -> FeedInput:
        if self.stale_groups == StaleGroups.REQUEUE and self.sink != "door":
            raise ValueError("stale_groups: requeue needs sink door (run-api has taken a group once it is posted)")
        return self


class GroupRun(BaseModel):
    """One group in flight: its item, the run of each rollout, what came back."""

    group_id: str
    item: Item
    results: list[TrajectoryResult | None]
    runs: list[str | None] = Field(description="The current run id of each rollout.")
    attempts: list[int] = Field(description="Runs each rollout has had.")
    resume_at: dict[int, float] = Field(
        default_factory=dict, description="Rollouts waiting to be resumed: index -> when."
    )
    resume_from: dict[int, str | None] = Field(default_factory=dict, description="...and the run each resumes from.")
    started_step: int = 0
    tree_run: str | None = Field(default=None, description="A branching group: the run of its RolloutTreeWorkflow.")
    tree_attempts: int = 0
    requeues: int = Field(default=0, description="Times its item was started again for being too stale (the door).")


class FeedFigures(BaseModel):
    """What the run has done, for people and dashboards (query `status`, `rollouts train status`)."""

    groups_started: int = 0
    groups_posted: int = 0
    groups_duplicated: int = 0
    """Posts whose answer was lost and that run-api already held when asked again (not sent twice)."""
    groups_stale: int = 0
    """Posted although staler than the bound (stale_groups: post, or scores_only with rollouts masked)."""
    dropped: dict[str, int] = Field(default_factory=dict)
    """Groups given up, by reason: `stale`, `retries_spent:<stop reason>`, `failed:<stop reason>`."""
    rollouts_started: int = 0
    rollouts_finished: int = 0
    rollouts_retried: int = 0
    rollouts_masked: int = 0
    tokens_generated: int = 0
    """Completion tokens of every finished rollout."""
    tokens_posted: int = 0
    """Trainable tokens (mask != -100) of the groups posted."""
    turns_finished: int = 0
    turns_posted: int = 0
    staleness: dict[str, int] = Field(default_factory=dict)
    """Groups posted by their staleness in trainer steps (current step at posting minus the oldest version)."""

    def drop(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1


class TrainerView(BaseModel):
    """What the feed last learnt from run-api."""

    registered: bool = False
    """A trainer registered (batch_size known)."""
    current_step: int = 0
    batch_size: int = -1
    max_token_len: int = -1
    queued: int = 0
    """Groups of this run waiting in run-api's queue."""
    env_id: int | None = None
    """This run's env registration, None until run-api takes it (after the trainer's first /batch)."""
    policy_version: int | None = None
    """The weights the policy server serves now, as a number of trainer steps (SGLang's `weight_version`
    in `/get_model_info`); None where the server reports none or a name that is not a number."""

    def batches_ahead(self) -> int:
        """1 while the trainer trains a batch run-api has handed out (its step) whose weights the server does
        not serve yet: the served version is exactly one behind run-api's step. A version further behind is a
        trainer that publishes every few steps or numbers its versions otherwise; it, an unknown version or
        one not behind counts 0, leaving run-api's step the only clock (never a feed that waits forever)."""
        return 1 if self.policy_version is not None and self.policy_version == self.current_step - 1 else 0


class FeedState(BaseModel):
    next_item: int = 0
    next_group: int = 0
    groups: dict[str, GroupRun] = Field(default_factory=dict)
    figures: FeedFigures = Field(default_factory=FeedFigures)
    trainer: TrainerView = Field(default_factory=TrainerView)
    inbox: list[TrajectoryResult] = Field(default_factory=list)
    trees: list[RolloutTreeResult] = Field(default_factory=list, description="Trees that ended, not yet taken.")
    stopping: bool = False
    output: str | None = None
    api_url: str | None = None
    door: DoorLedger = Field(default_factory=DoorLedger)
    requeue: list[DoorGroup] = Field(default_factory=list, description="Stale groups whose items start again.")


class DoorStatus(BaseModel):
    """The trainer door of a run (`sink: door`): where its batches stand."""

    batch_size: int
    """Sequences per batch; 0 until a trainer registers it."""
    trainer_version: int
    """The version the trainer trains from: its starting step plus the batches it acknowledged."""
    pending_groups: int
    """Finished groups in the object store, in no batch yet."""
    batches_out: int
    """Batches handed out and not yet acknowledged."""
    batches_to_redeliver: int
    """Batches whose lease ran out (or that were given back), to be handed out again."""
    next_number: int
    acknowledged_below: int
    figures: DoorFigures


class FeedStatus(BaseModel):
    """The answer to the feed's `status` query."""

    run: str
    env: str
    phase: str
    in_flight: int
    rollouts_running: int
    held: int = 0
    """Finished groups waiting for room in run-api (at most one batch of a run waits there)."""
    figures: FeedFigures
    trainer: TrainerView
    max_staleness: int
    admitted: bool
    """Whether a new group may start now (False: waiting for the trainer to step)."""
    stopping: bool
    output: str | None = None
    door: DoorStatus | None = None
    """The trainer door (`sink: door`)."""


FeedInput.model_rebuild()
