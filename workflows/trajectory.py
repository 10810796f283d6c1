"""TrajectoryWorkflow: one rollout, each step an activity, the slot released whatever happens.

acquire slot -> set up workspace -> (model turn -> tool calls)* -> verify -> release.
The conversation lives in the transcript store; the workflow carries only a reference,
so history grows by a fixed number of bytes per turn. A rollout the model ended (it
stopped calling tools, or hit a limit) is verified and scored. A rollout the machinery
ended (model down past its retries, no slot, an env bug) saves its workspace, releases
its slot and fails as a workflow carrying its TrajectoryResult, so it shows as Failed in
the UI and a new run (`resume_from_run`) continues from where it stopped. A fork (`fork`)
begins with another rollout's first K turns and workspace instead of a fresh setup, and a
rollout with a branch plan branches at its turns (workflows/forking.py).
"""

from __future__ import annotations

import asyncio
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from activities.images import BuildImageInput, ImageActivities
    from activities.resume import ResumeActivities, RunRef
    from activities.slots import AcquireSlotInput, SlotActivities
    from activities.snapshots import SnapshotActivities, SnapshotInput
    from activities.tools import ToolActivities, ToolCallInput
    from activities.verify import VerifyActivities, VerifyInput
    from activities.workspace import SetupWorkspaceInput, WorkspaceActivities
    from temporal_rollouts.core import search_attributes as sa
    from temporal_rollouts.core.forks import BRANCH_COPIED, BRANCH_WAITING, BranchCopied
    from temporal_rollouts.core.images import BuiltImage
    from temporal_rollouts.core.inputs import checked_input
    from temporal_rollouts.core.records import (
        ROLLOUT_FAILED,
        ROLLOUT_FINISHED,
        PendingCalls,
        StopReason,
        ToolErrorRecord,
        TrajectoryInput,
        TrajectoryResult,
    )
    from temporal_rollouts.sandbox_server.schema import SlotLease, SlotRef
    from temporal_rollouts.storage.snapshots import snapshot_key
    from workflows import params
    from workflows.forking import Forking
    from workflows.harness_loop import HarnessLoop
    from workflows.steps import StepFailed, stop_for
    from workflows.turns import model_turn


@workflow.defn(name="TrajectoryWorkflow")
class TrajectoryWorkflow:
    def __init__(self) -> None:
        self._phase = "starting"
        self._result: TrajectoryResult | None = None
        self._forking = Forking()

    @workflow.query
    def progress(self) -> dict:
        result = self._result
        return {
            "phase": self._phase,
            "turns": result.turns if result else 0,
            "tool_calls": result.tool_calls if result else 0,
        }

    @workflow.query
    def resume_state(self) -> TrajectoryResult | None:
        """How far the rollout got; answered by replay even after it was terminated."""
        return self._result

    @workflow.signal(name=BRANCH_COPIED)
    def branch_copied(self, note: BranchCopied) -> None:
        """A branch of this rollout has copied its workspace (or given up)."""
        self._forking.copied(note)

    @workflow.query(name=BRANCH_WAITING)
    def branch_waiting(self) -> list[str]:
        return self._forking.waiting()

    @workflow.run
    @checked_input
    async def run(self, input: TrajectoryInput) -> TrajectoryResult:
        input = input.narrowed_by_item()
        info = workflow.info()
        rollout_key = f"{info.workflow_id}/{info.run_id}"
        result = self._result = TrajectoryResult(
            rollout_id=info.workflow_id,
            env=input.env,
            item_id=input.item.id,
            group_index=input.group_index,
            stop_reason=StopReason.COMPLETED,
            run_id=info.run_id,
        )
        started = workflow.now()
        lease: SlotLease | None = None
        try:
            snapshot = await self._resume_point(input) if input.resume_from_run else None
            if input.fork is not None:
                workflow.upsert_search_attributes(
                    [sa.FORKED_FROM.value_set(input.fork.source), sa.FORK_TURN.value_set(input.fork.at_turn)]
                )
            forking = input.fork is not None and result.transcript is None
            if forking:
                self._phase = "fork"
                await self._forking.locate(input, self._step)
            image = await self._image(input)
            self._phase = "acquire"
            near = self._forking.near(input) if forking else None
            lease = await self._step(
                SlotActivities.acquire_slot,
                AcquireSlotInput(env=input.env, env_config=input.env_config, near=near, item=input.item, image=image),
                params.ACQUIRE_SLOT,
                StopReason.SANDBOX_ERROR,
                "acquire",
            )
            slot = lease.ref()
            harness = input.harness or (result.harness.spec if result.harness else None)
            if snapshot:
                self._phase = "restore"
                await self._step(
                    SnapshotActivities.restore_workspace,
                    SnapshotInput(lease=slot, key=snapshot),
                    params.SETUP_WORKSPACE,
                    StopReason.SANDBOX_ERROR,
                    "setup",
                )
            elif forking:
                self._phase = "rebuild"
                await self._forking.rebuild(input, slot, result, rollout_key, self._step)
            else:
                self._phase = "setup"
                ready = await self._step(
                    WorkspaceActivities.setup_workspace,
                    SetupWorkspaceInput(
                        env=input.env, env_config=input.env_config, item=input.item, lease=slot, rollout_key=rollout_key
                    ),
                    params.SETUP_WORKSPACE,
                    StopReason.ENV_ERROR,
                    "setup",
                )
                result.transcript, result.setup_meta = ready.transcript, ready.meta
                harness = input.harness or ready.harness
            self._forking.begin(result.turns, resumed=snapshot is not None)
            if result.agent_stop is None:
                if harness is not None:
                    await HarnessLoop(self._step, self._set_phase).run(input, harness, slot, result)
                else:
                    await self._agent_loop(input, slot)
                result.agent_stop, result.agent_stop_detail = result.stop_reason, result.stop_detail
            if result.stop_reason.scored:
                self._phase = "verify"
                assert result.transcript is not None
                verdict = await self._step(
                    VerifyActivities.verify,
                    VerifyInput(
                        env=input.env,
                        env_config=input.env_config,
                        item=input.item,
                        lease=slot,
                        rollout_key=rollout_key,
                        transcript=result.transcript,
                        meta=result.setup_meta,
                    ),
                    params.verify(input.item.timeouts.verify_s if input.item.timeouts else None),
                    StopReason.ENV_ERROR,
                    "verify",
                )
                result.score, result.verify_details = verdict.score, verdict.details
        except asyncio.CancelledError:
            result.stop_reason, result.stop_detail = StopReason.CANCELLED, "the rollout was cancelled"
            raise
        except workflow.NondeterminismError:
            raise  # a code change that breaks replay: the task must fail and wait for a fix, not end the rollout
        except Exception as err:  # noqa: BLE001  every failure, expected or not, is recorded the same way
            failed = err if isinstance(err, StepFailed) else _unexpected(err, self._phase)
            result.stop_reason, result.stop_detail, result.score = failed.reason, failed.detail, 0.0
            if lease is not None:
                await self._save_workspace(lease.ref(), rollout_key)
        finally:
            if lease is not None:
                self._phase = "release"
                await self._release(lease)
            self._phase = "done"
            result.timings["total"] = _seconds_since(started)
            workflow.upsert_search_attributes(
                [sa.STOP_REASON.value_set(result.stop_reason.value), sa.SCORE.value_set(result.score)]
            )
        if input.notify and result.stop_reason != StopReason.CANCELLED:
            await _tell(input.notify, result)
        if result.failed:
            raise ApplicationError(
                f"rollout stopped: {result.stop_reason.value}: {result.stop_detail}",
                result,
                type=ROLLOUT_FAILED,
                non_retryable=True,
            )
        return result

    async def _image(self, input: TrajectoryInput) -> BuiltImage | None:
        """The item's image, built (or found built) before the rollout takes a slot; None when it names none."""
        spec = input.item.image
        if spec is None:
            return None
        self._phase = "image"
        built = await self._step(
            ImageActivities.build_image,
            BuildImageInput(image=spec, item_id=input.item.id, env=input.env),
            params.build_image(spec.build_timeout_s),
            StopReason.IMAGE_BUILD_FAILED,
            "image",
        )
        assert self._result is not None
        self._result.image = built.name
        return built

    async def _resume_point(self, input: TrajectoryInput) -> str | None:
        """Take over an earlier run's progress; returns the snapshot to restore, if any."""
        result = self._result
        assert result is not None and input.resume_from_run
        self._phase = "resume"
        point = await self._step(
            ResumeActivities.load_resume_point,
            RunRef(workflow_id=result.rollout_id, run_id=input.resume_from_run),
            params.LOAD_ITEMS,
            StopReason.CONFIG_ERROR,
            "resume",
        )
        workflow.upsert_search_attributes([sa.RESUMED_FROM.value_set(input.resume_from_run)])
        result.resumed_from_run = input.resume_from_run
        if point.snapshot is None or point.result.transcript is None:
            workflow.logger.warning("no workspace snapshot of run %s: the rollout starts over", input.resume_from_run)
            return None
        earlier = point.result
        for field in (
            "transcript",
            "setup_meta",
            "tokens",
            "turns",
            "tool_calls",
            "tool_errors",
            "tool_stats",
            "pending",
            "agent_stop",
            "agent_stop_detail",
            "policy_versions",
            "completion_tokens",
            "fork",
            "branches",
            "harness",
        ):
            setattr(result, field, getattr(earlier, field))
        if earlier.agent_stop is not None:
            result.stop_reason, result.stop_detail = earlier.agent_stop, earlier.agent_stop_detail
        return point.snapshot

    async def _agent_loop(self, input: TrajectoryInput, slot: SlotRef) -> None:
        result = self._result
        assert result is not None and result.transcript is not None
        limits = input.limits
        loop_started = workflow.now()
        while True:
            if result.pending is None:
                if input.branch or input.snapshot_turns:
                    await self._forking.turn_done(input, slot, result)
                if result.turns >= limits.max_turns:
                    return self._stop(StopReason.MAX_TURNS, f"reached {limits.max_turns} turns")
                if _seconds_since(loop_started) >= limits.wall_clock_s:
                    return self._stop(StopReason.WALL_CLOCK, f"used the {limits.wall_clock_s:.0f}s budget")
                self._phase = f"turn {result.turns + 1}"
                turn = await model_turn(
                    self._step, input, slot, result, result.transcript, tokens=result.tokens, sampling=input.sampling
                )
                if isinstance(turn, StepFailed):
                    return self._stop(turn.reason, turn.detail)
                if not turn.calls:
                    return self._stop(StopReason.COMPLETED, turn.finish_reason or "")
                result.pending = PendingCalls(assistant=turn.assistant, count=turn.calls)
            await self._run_pending(input, slot)
            if result.tool_calls >= limits.max_tool_calls and result.pending is not None:
                return self._stop(StopReason.MAX_TOOL_CALLS, f"reached {limits.max_tool_calls} tool calls")

    async def _run_pending(self, input: TrajectoryInput, slot: SlotRef) -> None:
        result = self._result
        assert result is not None and result.pending is not None and result.transcript is not None
        pending = result.pending
        while pending.next_index < pending.count:
            if result.tool_calls >= input.limits.max_tool_calls:
                return
            index = pending.next_index
            self._phase = f"tool {result.turns}.{index}"
            call = ToolCallInput(
                lease=slot,
                call_key=f"turn-{result.turns}/call-{index}",
                transcript=result.transcript,
                assistant=pending.assistant,
                index=index,
                default_timeout_s=input.limits.command_timeout_s,
            )
            outcome = await self._step(
                ToolActivities.tool_call, call, params.TOOL_CALL_LOCAL, StopReason.SANDBOX_ERROR, "tools", local=True
            )
            result.tool_calls += 1
            result.tool_stats.record(outcome.counted_as())
            result.transcript = outcome.transcript
            pending.next_index += 1
            if outcome.error:
                result.tool_errors.append(
                    ToolErrorRecord(
                        turn=result.turns,
                        tool_name=outcome.name or "",
                        arguments=outcome.arguments_preview or "",
                        error=outcome.error,
                    )
                )
        result.pending = None

    def _set_phase(self, phase: str) -> None:
        self._phase = phase

    def _stop(self, reason: StopReason, detail: str) -> None:
        assert self._result is not None
        self._result.stop_reason, self._result.stop_detail = reason, detail

    async def _step(
        self, method, arg, step: params.StepParams, phase_default: StopReason, timing: str, *, local: bool = False
    ):
        started = workflow.now()
        execute = workflow.execute_local_activity_method if local else workflow.execute_activity_method
        try:
            return await execute(method, arg, **step.options())
        except ActivityError as err:
            if isinstance(err.cause, CancelledError):
                raise asyncio.CancelledError() from err
            raise stop_for(err, phase_default) from err
        except (asyncio.CancelledError, StepFailed, workflow.NondeterminismError):
            raise
        except Exception as err:  # anything else this step raised is still this step's failure
            raise StepFailed(phase_default, f"{timing} step failed: {type(err).__name__}: {err}") from err
        finally:
            assert self._result is not None
            timings = self._result.timings
            timings[timing] = round(timings.get(timing, 0.0) + _seconds_since(started), 3)

    async def _save_workspace(self, slot: SlotRef, rollout_key: str) -> None:
        """Before the slot goes back: the files a resumed run will continue with."""
        result = self._result
        assert result is not None
        info = workflow.info()
        self._phase = "snapshot"
        try:
            result.snapshot = await workflow.execute_activity_method(
                SnapshotActivities.snapshot_workspace,
                SnapshotInput(lease=slot, key=snapshot_key(info.workflow_id, info.run_id)),
                **params.SNAPSHOT.options(),
            )
        except ActivityError as err:
            workflow.logger.warning("could not save the workspace of %s: %s", rollout_key, err.cause or err)

    async def _release(self, lease: SlotLease) -> None:
        """Release even while the workflow is being cancelled; a failed release is left to the reaper."""
        release = asyncio.ensure_future(
            workflow.execute_activity_method(SlotActivities.release_slot, lease, **params.RELEASE_SLOT.options())
        )
        while not release.done():
            try:
                await asyncio.shield(release)
            except asyncio.CancelledError:
                continue
            except ActivityError as err:
                workflow.logger.warning("releasing slot %s failed: %s; the reaper will free it", lease.slot, err)
                return


async def _tell(workflow_id: str, result: TrajectoryResult) -> None:
    """Signal the feed that started this rollout with how it ended; a feed that is gone (stopped, or
    its run replaced) is not this rollout's failure: the feed's own reconciliation finds the result."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(ROLLOUT_FINISHED, result)
    except Exception as err:  # noqa: BLE001
        workflow.logger.warning("could not tell %s that %s ended: %s", workflow_id, result.rollout_id, err)


def _unexpected(err: Exception, phase: str) -> StepFailed:
    """A failure outside any step's own handling (a bug in workflow code, a bad value): the rollout
    still stops with a reason, saves its workspace and releases its slot."""
    return StepFailed(StopReason.ENV_ERROR, f"unexpected {type(err).__name__} during {phase}: {err}")


def _seconds_since(start: datetime) -> float:
    return round((workflow.now() - start).total_seconds(), 3)
