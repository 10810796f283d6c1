"""A rollout's fork and branch steps, kept apart from the trajectory loop they hook into.

`Forking` belongs to one TrajectoryWorkflow run. A fork begins with the state after turn
K (carried by a live branch, else read from storage by `load_fork_point`) and a workspace
rebuilt the first way that works: the parent's live copy, a snapshot of that turn, a
replay of the recorded tool calls. At the end of each turn it saves the workspace when
the rollout keeps turn snapshots; at a branch point it asks its tree for the siblings,
waits (bounded) while they copy its workspace, saves a snapshot for any that come too
late, and goes on as sibling 0. Every command here is issued only for inputs that set
`fork`, `branch` or `snapshot_turns`, so other rollouts replay exactly as before.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from activities.fork_points import ForkPointInput, ForkPoints
    from activities.forks import CopyWorkspaceInput, ForkActivities, ReplayInput, ReplayReport
    from activities.snapshots import SnapshotActivities, SnapshotInput
    from activities.workspace import SetupWorkspaceInput, WorkspaceActivities
    from temporal_rollouts.core.forks import (
        BRANCH_COPIED,
        BRANCH_REQUESTED,
        NOT_CARRIED,
        BranchCopied,
        BranchPlan,
        BranchRecord,
        BranchRequest,
        ForkOrigin,
        ForkPrefix,
        WorkspaceSource,
        branch_id,
    )
    from temporal_rollouts.core.records import StopReason, TrajectoryInput, TrajectoryResult
    from temporal_rollouts.sandbox_server.schema import SlotRef
    from temporal_rollouts.storage.snapshots import turn_snapshot_key
    from workflows import params
    from workflows.steps import StepFailed

Step = Callable[..., Awaitable[Any]]
"""TrajectoryWorkflow._step: run an activity, turning its failure into the rollout's stop reason."""
CARRIED_FIELDS = ("tokens", "turns", "tool_calls", "tool_errors", "policy_versions")


class Forking:
    def __init__(self) -> None:
        self._prefix: ForkPrefix | None = None
        self._snapshot: str | None = None
        self._source_run: str | None = None
        self._awaiting: set[str] = set()
        self._copied: set[str] = set()
        self._done_turns: set[int] = set()
        self._start_turns = 0
        self._branch_from = 0

    def copied(self, note: BranchCopied) -> None:
        self._awaiting.discard(note.child)
        if note.ok:
            self._copied.add(note.child)

    def waiting(self) -> list[str]:
        return sorted(self._awaiting)

    def begin(self, turns: int, resumed: bool) -> None:
        """The rollout's own work starts at `turns`; a resumed run never branches at a turn it took over."""
        self._start_turns = turns
        self._branch_from = turns + 1 if resumed else 0

    def near(self, input: TrajectoryInput) -> str | None:
        """The container to lease beside: a live branch's parent's, on its first run."""
        fork = input.fork
        return fork.copy_from.container_id if fork and fork.copy_from and not input.resume_from_run else None

    async def locate(self, input: TrajectoryInput, step: Step) -> None:
        fork = input.fork
        assert fork is not None
        if fork.prefix is not None:
            self._prefix, self._source_run = fork.prefix, fork.source_run
            return
        point = await step(
            ForkPoints.load_fork_point,
            ForkPointInput(source=fork.source, source_run=fork.source_run, at_turn=fork.at_turn),
            params.LOAD_FORK_POINT,
            StopReason.CONFIG_ERROR,
            "fork",
        )
        self._prefix, self._snapshot, self._source_run = point.prefix, point.snapshot, point.source_run

    async def rebuild(
        self, input: TrajectoryInput, slot: SlotRef, result: TrajectoryResult, rollout_key: str, step: Step
    ) -> None:
        """The workspace after turn K in `slot`, then the prefix taken over; a replay that diverged stops the
        rollout (fork_diverged) before its model runs, unless the fork allows it."""
        fork, prefix = input.fork, self._prefix
        assert fork is not None and prefix is not None
        source: WorkspaceSource | None = None
        in_place = False
        snapshot, session_used, report, meta = self._snapshot, prefix.session_used, None, prefix.setup_meta
        copy_from = fork.copy_from  # on a resume too: the copy then finds its parent gone on, and falls back
        if copy_from is not None:
            outcome = None
            try:
                outcome = await step(
                    ForkActivities.copy_workspace,
                    CopyWorkspaceInput(
                        source=copy_from,
                        target=slot,
                        parent=fork.source,
                        parent_run=fork.source_run,
                        child=workflow.info().workflow_id,
                        prefix=prefix.transcript,
                    ),
                    params.COPY_WORKSPACE,
                    StopReason.SANDBOX_ERROR,
                    "setup",
                )
            finally:
                note = BranchCopied(child=workflow.info().workflow_id, ok=bool(outcome and outcome.copied))
                await _signal(fork.source, fork.source_run, BRANCH_COPIED, note)
            source = "copy" if outcome.copied else None
            in_place = outcome.copied and outcome.in_place
            snapshot, session_used = outcome.fallback_snapshot, outcome.session_used
        if source is None and fork.rebuild == "snapshot" and snapshot is None:
            raise StepFailed(
                StopReason.CONFIG_ERROR,
                f"no snapshot of turn {fork.at_turn} of {fork.source} "
                "(it ran without snapshot_turns): rebuild it by replay",
            )
        if source is None and snapshot is not None and fork.rebuild != "replay":
            await step(
                SnapshotActivities.restore_workspace,
                SnapshotInput(lease=slot, key=snapshot),
                params.SETUP_WORKSPACE,
                StopReason.SANDBOX_ERROR,
                "setup",
            )
            source = "snapshot"
        if source is None:
            report, meta = await self._replay(input, slot, prefix, rollout_key, step)
            source = "replay"
        result.fork = ForkOrigin(
            parent=fork.source,
            parent_run=fork.source_run or self._source_run,
            at_turn=fork.at_turn,
            prefix_tokens=prefix.tokens.tokens if prefix.tokens else 0,
            prefix_messages=prefix.transcript.messages,
            workspace=source,
            copied_in_place=in_place,
            replayed_calls=report.calls if report else 0,
            divergences=report.divergences if report else [],
            not_carried=[NOT_CARRIED] if session_used and source != "replay" else [],
        )
        if report is not None and report.divergent and not fork.allow_divergence:
            first = report.divergences[0]
            raise StepFailed(
                StopReason.FORK_DIVERGED,
                (
                    f"{report.divergent} replayed result(s) differ from the recorded ones; the first, turn {first.turn} "
                    f"{first.tool}: recorded {first.recorded!r}, replayed {first.replayed!r} (allow_divergence goes on)"
                ),
            )
        for field in CARRIED_FIELDS:
            setattr(result, field, getattr(prefix, field))
        result.transcript, result.setup_meta = prefix.transcript, meta
        result.tool_stats = prefix.tool_stats.model_copy()

    async def _replay(
        self, input: TrajectoryInput, slot: SlotRef, prefix: ForkPrefix, rollout_key: str, step: Step
    ) -> tuple[ReplayReport, dict[str, Any]]:
        ready = await step(
            WorkspaceActivities.setup_workspace,
            SetupWorkspaceInput(
                env=input.env,
                env_config=input.env_config,
                item=input.item,
                lease=slot,
                rollout_key=rollout_key,
            ),
            params.SETUP_WORKSPACE,
            StopReason.ENV_ERROR,
            "setup",
        )
        report = await step(
            ForkActivities.replay_tool_calls,
            ReplayInput(
                lease=slot,
                transcript=prefix.transcript,
                setup=ready.transcript,
                default_timeout_s=input.limits.command_timeout_s,
            ),
            params.REPLAY_TOOL_CALLS,
            StopReason.SANDBOX_ERROR,
            "setup",
        )
        return report, ready.meta

    async def turn_done(self, input: TrajectoryInput, slot: SlotRef, result: TrajectoryResult) -> None:
        """At the end of a turn (its tool calls all run): a turn snapshot, then a branch point, as asked."""
        turn = result.turns
        if turn in self._done_turns:
            return
        self._done_turns.add(turn)
        if input.snapshot_turns and turn > self._start_turns:
            await self._save(slot, result)
        plan = input.branch
        if plan and turn in plan.at_turns and turn >= self._branch_from and turn < input.limits.max_turns:
            await self._branch(plan, slot, result, turn)

    async def _branch(self, plan: BranchPlan, slot: SlotRef, result: TrajectoryResult, turn: int) -> None:
        info = workflow.info()
        assert result.transcript is not None
        children = [branch_id(info.workflow_id, turn, index) for index in range(1, plan.factor)]
        prefix = ForkPrefix(
            transcript=result.transcript,
            tokens=result.tokens,
            turns=turn,
            tool_calls=result.tool_calls,
            tool_stats=result.tool_stats.model_copy(),
            tool_errors=list(result.tool_errors),
            policy_versions=list(result.policy_versions),
            setup_meta=result.setup_meta,
        )
        request = BranchRequest(
            parent=info.workflow_id, parent_run=info.run_id, turn=turn, children=children, prefix=prefix, slot=slot
        )
        self._awaiting = set(children)
        record = BranchRecord(turn=turn, children=children)
        if not await _signal(plan.tree, None, BRANCH_REQUESTED, request):
            self._awaiting.clear()
            record.children = []
        try:
            await workflow.wait_condition(lambda: not self._awaiting, timeout=plan.copy_wait_s)
        except TimeoutError:
            record.snapshot = await self._save(slot, result)  # before the late ones are told they are late
        self._awaiting.clear()
        record.copied = [child for child in record.children if child in self._copied]
        result.branches.append(record)

    async def _save(self, slot: SlotRef, result: TrajectoryResult) -> str | None:
        assert result.transcript is not None
        key = turn_snapshot_key(workflow.info().workflow_id, result.transcript.head)
        try:
            return await workflow.execute_activity_method(
                SnapshotActivities.snapshot_workspace, SnapshotInput(lease=slot, key=key), **params.SNAPSHOT.options()
            )
        except ActivityError as err:
            workflow.logger.warning("could not save the workspace after turn %d: %s", result.turns, err.cause or err)
            return None


async def _signal(workflow_id: str, run_id: str | None, name: str, arg: Any) -> bool:
    """Signal another workflow; one that is gone is logged, never this rollout's failure."""
    try:
        await workflow.get_external_workflow_handle(workflow_id, run_id=run_id).signal(name, arg)
        return True
    except Exception as err:  # noqa: BLE001
        workflow.logger.warning("could not signal %s (%s): %s", workflow_id, name, err)
        return False
