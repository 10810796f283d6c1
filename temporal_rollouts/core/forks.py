"""A rollout as a tree: forks after the fact, and branches made live inside a batch.

A fork is a new rollout that begins with another's first K turns and its workspace as it
was after turn K. The turns are not regenerated: the fork's transcript and token trace
are the source's own chains cut at turn K (storage keeps both as hash chains, so a prefix
is just an earlier head), and only the continuation's model turns cost tokens. The
workspace is rebuilt one of three ways: copied from the parent's live slot (a branch),
restored from a snapshot taken at that turn, or rebuilt by replaying the recorded tool
calls 1..K in a fresh slot and comparing each output with the recorded one. The stateful
terminal's session (its shell, directory, variables and processes) is never carried by a
copy or a snapshot; a replay starts it anew by running its commands again.

A branch is a fork a running rollout makes of itself at a chosen turn: it keeps going as
one of `factor` siblings and its RolloutTreeWorkflow starts the others, which copy its
workspace while it waits. These models are what workflows carry for both.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from temporal_rollouts.core import defaults
from temporal_rollouts.core.refs import TokenTraceRef, TranscriptRef
from temporal_rollouts.core.tool_stats import ToolErrorRecord, ToolStats
from temporal_rollouts.sandbox_server.schema import SlotRef

MAX_BRANCH_FACTOR = 64
MAX_BRANCH_POINTS = 8
DEFAULT_COPY_WAIT_S = 300.0
"""How long a parent waits for its branches to copy its workspace before it saves a snapshot for the
late ones and goes on (a pool with no free slot must not hold every parent still)."""

BRANCH_REQUESTED = "branch_requested"
"""Signal a branching rollout sends its tree: start these siblings from my turn K."""
BRANCH_COPIED = "branch_copied"
"""Signal a branch sends its parent once its copy of the parent's workspace is done (or failed)."""
BRANCH_WAITING = "branch_waiting"
"""Query: the branches a parent still waits for; a copy taken while its branch is listed is good."""

PrefixTokens = Literal["once", "every_branch"]
WorkspaceRebuild = Literal["auto", "snapshot", "replay"]
WorkspaceSource = Literal["copy", "snapshot", "replay"]
SESSION_TOOLS = ("terminal_stateful", "tmux")
"""Tools whose effect lives in the stateful terminal's processes as well as in files."""
NOT_CARRIED = (
    "the stateful terminal's session (its shell, working directory, variables and background "
    "processes): a fork starts with none, and the model's next session command starts a new one"
)


class BranchSpec(BaseModel):
    """`BatchInput.branch`: every rollout of the batch branches at these turns into `factor` siblings."""

    model_config = ConfigDict(extra="forbid")

    at_turns: list[int] = Field(description="Turns after which a rollout branches (0: right after its setup).")
    factor: int = Field(ge=2, le=MAX_BRANCH_FACTOR, description="Siblings per branch point, the parent included.")
    prefix_tokens: PrefixTokens = Field(
        default="once",
        description="once: the shared prefix is trained in one sibling (the parent) and masked "
        "in the others; every_branch: each sibling trains its whole sequence.",
    )
    copy_wait_s: float = Field(
        default=DEFAULT_COPY_WAIT_S,
        gt=0,
        description="How long a parent waits for its branches' copies of its workspace.",
    )

    @field_validator("at_turns")
    @classmethod
    def _turns(cls, turns: list[int]) -> list[int]:
        if not turns or len(turns) > MAX_BRANCH_POINTS:
            raise ValueError(f"give between 1 and {MAX_BRANCH_POINTS} turns")
        if any(turn < 0 for turn in turns):
            raise ValueError("a rollout branches after a turn: each turn must be at least 0")
        return sorted(set(turns))

    def tree_size(self, roots: int = 1) -> int:
        """Rollouts in a tree whose every rollout reaches every branch point (an upper bound)."""
        return roots * self.factor ** len(self.at_turns)


class BranchPlan(BaseModel):
    """`TrajectoryInput.branch`: where this rollout branches, and the tree workflow that starts its siblings."""

    at_turns: list[int]
    factor: int = Field(ge=2, le=MAX_BRANCH_FACTOR)
    tree: str = Field(description="Workflow id of the RolloutTreeWorkflow told of each branch point.")
    copy_wait_s: float = DEFAULT_COPY_WAIT_S

    def after(self, turn: int) -> BranchPlan | None:
        """The plan of a branch made at `turn`: the later branch points only."""
        later = [t for t in self.at_turns if t > turn]
        return self.model_copy(update={"at_turns": later}) if later else None


class ForkPrefix(BaseModel):
    """A rollout's state after turn K, by reference: what a fork takes over."""

    transcript: TranscriptRef
    tokens: TokenTraceRef | None = None
    turns: int
    tool_calls: int = 0
    tool_stats: ToolStats = Field(default_factory=ToolStats)
    tool_errors: list[ToolErrorRecord] = Field(default_factory=list)
    policy_versions: list[int | None] = Field(default_factory=list)
    setup_meta: dict[str, Any] = Field(default_factory=dict)
    session_used: bool = Field(default=False, description="Whether turns 1..K used the stateful terminal.")


class ForkSpec(BaseModel):
    """`TrajectoryInput.fork`: begin with `source`'s first `at_turn` turns and its workspace after them."""

    model_config = ConfigDict(extra="forbid")

    source: str = Field(description="Rollout id forked from.")
    source_run: str | None = Field(default=None, description="Its run; the latest when unset.")
    at_turn: int = Field(ge=0)
    prefix: ForkPrefix | None = Field(
        default=None, description="Carried by a live branch; read from storage when unset."
    )
    copy_from: SlotRef | None = Field(
        default=None, description="A live branch: the parent's slot, copied while it waits."
    )
    rebuild: WorkspaceRebuild = Field(
        default=defaults.FORK_REBUILD,
        description="Without a live copy: a snapshot of that turn (auto: when one exists) or a replay.",
    )
    allow_divergence: bool = Field(default=False, description="Go on when a replayed tool call answers differently.")


class Divergence(BaseModel):
    """A replayed tool call whose output differs from the recorded one."""

    turn: int
    call: int
    tool: str
    recorded: str
    replayed: str


class ForkOrigin(BaseModel):
    """`TrajectoryResult.fork`: where a forked rollout came from and how its workspace was rebuilt."""

    parent: str
    parent_run: str | None = None
    at_turn: int
    prefix_tokens: int = Field(default=0, description="Tokens of the shared prefix (token-level policies).")
    prefix_messages: int = 0
    workspace: WorkspaceSource
    copied_in_place: bool = Field(default=False, description="A copy made by the container's server, slot to slot.")
    replayed_calls: int = 0
    divergences: list[Divergence] = Field(default_factory=list)
    not_carried: list[str] = Field(default_factory=list)


class BranchRecord(BaseModel):
    """`TrajectoryResult.branches`: one branch point of this rollout."""

    turn: int
    children: list[str]
    copied: list[str] = Field(default_factory=list, description="Branches that copied the live workspace.")
    snapshot: str | None = Field(default=None, description="Saved for branches that came too late to copy it.")


class BranchRequest(BaseModel):
    """What a branching rollout tells its tree: start `children` from my state after `turn`."""

    parent: str
    parent_run: str
    turn: int
    children: list[str]
    prefix: ForkPrefix
    slot: SlotRef


class BranchCopied(BaseModel):
    child: str
    ok: bool


def branch_id(parent: str, turn: int, index: int) -> str:
    """Sibling `index` (1..factor-1) of `parent` at `turn`; the parent itself is sibling 0."""
    return f"{parent}/t{turn}b{index}"
