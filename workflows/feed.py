"""TrainingFeedWorkflow: one training run, for as long as the trainer trains.

Its workflow id is the run's name. It owns the cursor over items, the groups in flight and where
finished groups go, so nothing of a run lives in the process that started it: `rollouts train`, the
door's endpoint, the Atropos env process (`serve`) or the UI only start it or talk to it by name.

- **The trainer door** (`sink: door`, the default): finished groups are stored in the object store
  and their keys kept in the run's ledger (`core/door.py`); a trainer takes numbered batches and
  acknowledges them through Updates (`take_batch`, `ack_batch`, `release_batch`, `register_trainer`)
  that the door's endpoint (`temporal_rollouts/door/`) sends. Admission counts what the trainer has
  not acknowledged; staleness is decided when a batch is formed, at consumption.

- **Admission** (AReaL's rule, in groups): a group starts only while the groups in flight, those of
  this run waiting for the trainer (at the door: stored or taken and not acknowledged; at run-api:
  queued there, and the batches handed out but not yet trained into served weights) fit in
  `max_staleness + 1` of the trainer's batches, so a group lands within `max_staleness` trainer
  steps of the weights it started on. The last term needs the policy server's weight version (as SGLang
  reports it): run-api counts a step when it hands a batch out, so a trainer still training it would
  otherwise look one version ahead of the weights it serves (`TrainerView.batches_ahead`).
  Starts are paced; finished work is never thrown away for being slow, which would bias training
  towards short rollouts.
- **Rollouts** are TrajectoryWorkflows started as abandoned children: they outlive this run's
  continue-as-new and tell the current run when they end (signal `rollout_finished`). A periodic
  check finds those that ended without telling (terminated, timed out).
- **Failures of the machinery are work to finish**: such a rollout is resumed (its workspace and
  turns kept) up to `max_retries` times; only then is its group given up, counted with why.
  A failure the model caused is a scored rollout and stays in its group.
- **Posting** to run-api: once per group (`activities.feed`), with each rollout's per-turn policy
  versions, oldest first, and only while less than one batch of this run waits in run-api (see
  `_may_post`); a group that ends staler than the bound is posted, masked or dropped as `stale_groups`
  says.
- It continues as new when Temporal suggests it, without waiting for any rollout.
- **Branching** (`branch`): a group is one RolloutTreeWorkflow (workflows/tree.py) of its roots and
  the siblings they branch into; it is posted with its tree and resumed as a whole.

Signals: `rollout_finished`, `stop` (drain: no new groups, finish and post the rest; at the door, the
run ends once the trainer has acknowledged every group), `stop_now` (cancel the rollouts in flight).
Query: `status`. Updates: the door's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from datetime import timedelta

from temporalio import workflow
from temporalio.common import SearchAttributePair, TypedSearchAttributes, WorkflowIDReusePolicy
from temporalio.exceptions import ActivityError, ApplicationError, ChildWorkflowError
from temporalio.workflow import ParentClosePolicy

with workflow.unsafe.imports_passed_through():
    from activities.envs import EnvActivities, LoadItemsInput
    from activities.feed import FeedActivities, FeedCheckInput, FeedGroupInput, RunsToCheck, TrainerQuery
    from temporal_rollouts.core import search_attributes as sa
    from temporal_rollouts.core.door import (
        AckAnswer,
        AckRequest,
        DoorError,
        DoorGroup,
        RegisterRequest,
        ReleaseRequest,
        TakeAnswer,
        TakeRequest,
        TakeRules,
    )
    from temporal_rollouts.core.feed import (
        RETRIED_STOPS,
        DoorStatus,
        FeedInput,
        FeedState,
        FeedStatus,
        GroupRun,
        TrainerView,
    )
    from temporal_rollouts.core.inputs import checked_input
    from temporal_rollouts.core.records import ROLLOUT_FINISHED, StopReason, TrajectoryInput, TrajectoryResult
    from temporal_rollouts.core.tasks import Item
    from temporal_rollouts.core.trees import ROLLOUT_TREE_FINISHED, RolloutTreeInput, RolloutTreeResult
    from temporal_rollouts.storage.feed_groups import group_key
    from workflows import params
    from workflows.children import result_from_failure
    from workflows.trajectory import TrajectoryWorkflow
    from workflows.tree import RolloutTreeWorkflow
    from workflows.upgrades import continue_on_current_build, time_to_continue

ITEM_PAGE = 100
TRAINER_WAIT_S = 30.0
"""How long one wait for the trainer to step lasts (it returns sooner when the trainer steps)."""
VIEW_MAX_AGE_S = 1.0
"""The trainer's step and queue are asked again before starting groups once this old (posts in between
are counted into the queue here, so an older view never lets in a group the bound keeps out)."""
CHECK_ROLLOUTS_S = 120.0
"""How often rollouts that never told how they ended are looked for."""
MAX_BACKOFF_S = 300.0
TREE = -1
"""`GroupRun.resume_at` key of a branching group's whole tree."""


def rollout_id(run: str, group_id: str, index: int) -> str:
    return f"{run}/{group_id}/r{index}"


def _place(rollout: str) -> tuple[str, int]:
    """(group id, index) of one of this feed's rollout ids."""
    _, group_id, index = rollout.rsplit("/", 2)
    return group_id, int(index.removeprefix("r"))


@workflow.defn(name="TrainingFeedWorkflow")
class TrainingFeedWorkflow:
    def __init__(self) -> None:
        self._input: FeedInput | None = None
        self._state = FeedState()
        self._phase = "starting"
        self._stop_now = False
        self._page: list[Item] = []
        self._page_start = 0
        self._item_count: int | None = None
        self._allow_network = False
        self._waiter: asyncio.Task[TrainerView] | None = None
        self._watching: set[asyncio.Future[None]] = set()
        self._checked_at: float = 0.0
        self._viewed_at: float = float("-inf")
        self._posts = 0
        """Groups this run handed to run-api (in this run's memory: a waiter never spans continue-as-new)."""
        self._waiter_posts = 0
        """`_posts` when the outstanding waiter was asked."""
        self._door_changes = 0
        """Takes, acknowledgements and registrations heard: the run's loop wakes when this moves."""

    # ------------------------------------------------------------------ signals and query

    @workflow.signal(name=ROLLOUT_FINISHED)
    def rollout_finished(self, result: TrajectoryResult) -> None:
        self._state.inbox.append(result)

    @workflow.signal(name=ROLLOUT_TREE_FINISHED)
    def rollout_tree_finished(self, tree: RolloutTreeResult) -> None:
        self._state.trees.append(tree)

    @workflow.signal
    def stop(self) -> None:
        """Start no more groups; finish and post those in flight, then end."""
        self._state.stopping = True

    @workflow.signal
    def stop_now(self) -> None:
        """Cancel the rollouts in flight (they save their workspaces and give their slots back) and end."""
        self._state.stopping = self._stop_now = True

    @workflow.query
    def status(self) -> FeedStatus:
        input, state = self._input, self._state
        return FeedStatus(
            run=workflow.info().workflow_id,
            env=input.env if input else "",
            phase=self._phase,
            in_flight=len(state.groups),
            rollouts_running=sum(1 for g in state.groups.values() for r in g.results if r is None),
            held=sum(1 for g in state.groups.values() if all(r is not None for r in g.results)),
            figures=state.figures,
            trainer=state.trainer,
            max_staleness=input.max_staleness if input else 0,
            admitted=self._admitted() if input else False,
            stopping=state.stopping,
            output=state.output,
            door=self._door_status() if input and input.sink == "door" else None,
        )

    def _door_status(self) -> DoorStatus:
        door = self._state.door
        return DoorStatus(
            batch_size=door.batch_size,
            trainer_version=door.trainer_version(),
            pending_groups=len(door.pending),
            batches_out=sum(1 for b in door.batches if b.lease is not None),
            batches_to_redeliver=sum(1 for b in door.batches if b.lease is None),
            next_number=door.next_number,
            acknowledged_below=door.acknowledged_below,
            figures=door.figures,
        )

    # ------------------------------------------------------------------ the door (Updates the endpoint sends)

    @workflow.update(name="take_batch")
    def take_batch(self, request: TakeRequest) -> TakeAnswer:
        """The next batch for a trainer: one whose lease ran out, else a new one formed now from the freshest
        rules of staleness (core/door.py); no batch when fewer than a batch's groups are stored."""
        with _door_errors():
            answer = self._state.door.take(request, workflow.time(), self._take_rules())
        self._state.requeue.extend(answer.requeue)
        self._door_changes += 1
        return answer

    @take_batch.validator
    def _may_take(self, request: TakeRequest) -> None:
        """Refused (and so never recorded in history) while there is nothing to hand out: trainers poll."""
        if _started(self._input).sink != "door":
            raise ApplicationError(
                f"run {workflow.info().workflow_id} sends its groups to {self._input.sink}", type="DoorError"
            )
        if self._state.door.batch_size <= 0:
            raise ApplicationError("no batch size yet: register the trainer first", type="DoorError")
        if not self._state.door.may_take(request, workflow.time(), self._take_rules()):
            raise ApplicationError("no batch yet", type="NoBatchYet")

    @workflow.update(name="ack_batch")
    def ack_batch(self, request: AckRequest) -> AckAnswer:
        with _door_errors():
            answer = self._state.door.acknowledge(request)
        self._door_changes += 1
        return answer

    @ack_batch.validator
    def _may_ack(self, request: AckRequest) -> None:
        _started(self._input)
        with _door_errors():
            self._state.door.model_copy(deep=True).acknowledge(request)

    @workflow.update(name="release_batch")
    def release_batch(self, request: ReleaseRequest) -> None:
        with _door_errors():
            self._state.door.release(request)
        self._door_changes += 1

    @release_batch.validator
    def _may_release(self, request: ReleaseRequest) -> None:
        _started(self._input)
        with _door_errors():
            self._state.door.model_copy(deep=True).release(request)

    @workflow.update(name="register_trainer")
    def register_trainer(self, request: RegisterRequest) -> DoorStatus:
        with _door_errors():
            self._state.door.register(request)
        self._door_changes += 1
        return self._door_status()

    @register_trainer.validator
    def _may_register(self, request: RegisterRequest) -> None:
        if _started(self._input).sink != "door":
            raise ApplicationError(
                f"run {workflow.info().workflow_id} sends its groups to {self._input.sink}", type="DoorError"
            )
        with _door_errors():
            self._state.door.model_copy(deep=True).register(request)

    def _take_rules(self) -> TakeRules:
        input, state = self._input, self._state
        assert input is not None
        return TakeRules(
            per_batch=self._per_step(),
            max_staleness=input.max_staleness,
            stale_groups=input.stale_groups,
            max_requeues=input.max_retries,
            final=self._done_starting() and not state.groups and not state.requeue,
        )

    # ------------------------------------------------------------------ the run

    @workflow.run
    @checked_input
    async def run(self, input: FeedInput) -> FeedStatus:
        self._input = input
        if input.state is not None:  # continued as new: signals that came before this line are kept too
            carried = input.state
            carried.inbox = [*carried.inbox, *self._state.inbox]
            carried.stopping = carried.stopping or self._state.stopping
            self._state = carried
        if input.sink == "door" and input.batch_size and not self._state.door.batch_size:
            self._state.door.batch_size = input.batch_size  # before any await: a trainer may take at once
        run = workflow.info().workflow_id
        workflow.upsert_search_attributes([sa.ENV.value_set(input.env), sa.BATCH_ID.value_set(run)])
        check = await workflow.execute_activity_method(
            FeedActivities.check_feed,
            FeedCheckInput(
                run=run,
                api_url=input.api_url,
                env=input.env,
                env_config=input.env_config,
                policy=input.policy,
                tokenizer=input.tokenizer,
                sink=input.sink,
                output=input.output,
            ),
            **params.FEED_CHECK.options(),
        )
        self._item_count, self._allow_network = check.item_count, check.allow_network
        self._state.output, self._state.api_url = check.output, check.api_url
        self._checked_at = workflow.time()
        while True:
            await self._take_inbox()
            if self._stop_now:
                await self._cancel_in_flight()
                break
            if self._finished():
                break
            await self._resume_due()
            await self._start_groups()
            if time_to_continue():
                await self._continue_as_new()
            await self._wait()
            if workflow.time() - self._checked_at >= CHECK_ROLLOUTS_S:
                await self._check_rollouts()
        self._phase = "done"
        return self.status()

    def _finished(self) -> bool:
        """Nothing in flight and nothing more to start; at the door, every stored group acknowledged too."""
        state = self._state
        assert self._input is not None
        if not self._done_starting() or state.groups or (state.requeue and not state.stopping):
            return False
        return self._input.sink != "door" or state.door.is_empty()

    def _done_starting(self) -> bool:
        input, state = self._input, self._state
        assert input is not None
        return bool(
            state.stopping
            or (input.max_groups and self._groups_counted() >= input.max_groups)
            or (
                not input.cycle_items
                and self._item_count is not None
                and state.next_item >= self._item_count - input.item_offset
            )
        )

    def _groups_counted(self) -> int:
        """Groups started, less those started again for being too stale (they replace one, they add none)."""
        return self._state.figures.groups_started - self._state.door.figures.groups_requeued

    # ------------------------------------------------------------------ admission and starting

    def _wants_more(self) -> bool:
        input, state = self._input, self._state
        assert input is not None
        if state.stopping or len(state.groups) >= input.max_groups_in_flight:
            return False
        if state.requeue:
            return True
        if input.max_groups and self._groups_counted() >= input.max_groups:
            return False
        return input.cycle_items or self._item_count is None or state.next_item < self._item_count - input.item_offset

    def _admitted(self) -> bool:
        input = self._input
        assert input is not None
        if not self._wants_more():
            return False
        if input.sink == "jsonl":
            return True
        if input.sink == "door":
            door = self._state.door
            if door.batch_size <= 0:
                return False
            # stored or taken and not acknowledged: the trainer trains them before any group started now
            return len(self._state.groups) + door.waiting_groups() < (input.max_staleness + 1) * self._per_step()
        trainer = self._state.trainer
        if not trainer.registered or trainer.env_id is None:
            return False
        per_step = self._per_step()
        waiting = trainer.queued + trainer.batches_ahead() * per_step  # posted, not yet trained into weights
        return len(self._state.groups) + waiting < (input.max_staleness + 1) * per_step

    def _per_step(self) -> int:
        """This run's groups in one of the trainer's batches."""
        assert self._input is not None
        batch_size = self._state.door.batch_size if self._input.sink == "door" else self._state.trainer.batch_size
        return max(1, batch_size // self._input.group_size)

    def _may_post(self) -> bool:
        """Whether a finished group may go to run-api now. At most one batch of this run waits there: run-api
        forms every full batch of its queue at one /batch call and hands the newest out first, so a second
        batch queued behind the first would reach the trainer a step later than its turn, staler than the
        bound. A finished group waits here instead (still counted in flight), and a stop posts them all."""
        input, state = self._input, self._state
        assert input is not None
        return input.sink != "atropos" or state.stopping or state.trainer.queued < self._per_step()

    def _held(self) -> bool:
        return any(all(r is not None for r in g.results) for g in self._state.groups.values())

    async def _start_groups(self) -> None:
        input = self._input
        assert input is not None
        if not self._wants_more():
            return
        if input.sink == "atropos" and workflow.time() - self._viewed_at >= VIEW_MAX_AGE_S:
            self._state.trainer = await self._trainer(wait_s=0)
            self._viewed_at = workflow.time()
        while self._admitted():
            await self._start_group()

    async def _start_group(self) -> None:
        input, state = self._input, self._state
        assert input is not None
        self._phase = "starting a group"
        requeues = 0
        if state.requeue:  # a stale group's item, started again on fresher weights
            stale = state.requeue.pop(0)
            item, requeues = stale.item, stale.requeues + 1
        else:
            item = await self._item(state.next_item)
            state.next_item += 1
        group_id = f"g{state.next_group}"
        state.next_group += 1
        group = GroupRun(
            group_id=group_id,
            item=item,
            results=[None] * input.group_size,
            runs=[None] * input.group_size,
            attempts=[0] * input.group_size,
            started_step=state.door.trainer_version() if input.sink == "door" else state.trainer.current_step,
            requeues=requeues,
        )
        state.groups[group_id] = group
        state.figures.groups_started += 1
        if input.branch is not None:
            await self._start_tree(group, resume=False)
            return
        for index in range(input.group_size):
            await self._start_rollout(group, index, resume_from=None)

    def _rollout_input(self, group: GroupRun, index: int, resume_from: str | None, notify: bool) -> TrajectoryInput:
        input = self._input
        assert input is not None
        run = workflow.info().workflow_id
        return TrajectoryInput(
            env=input.env,
            item=group.item,
            env_config=input.env_config,
            policy=input.policy,
            tool_call_parser=input.tool_call_parser,
            allow_network=self._allow_network,
            limits=input.limits,
            sampling=input.sampling,
            batch_id=run,
            group_index=index,
            resume_from_run=resume_from,
            notify=run if notify else None,
        )

    async def _start_tree(self, group: GroupRun, resume: bool) -> None:
        """A branching group: one RolloutTreeWorkflow of its roots and their branches, abandoned like a rollout
        and telling this run when it ends (signal `rollout_tree_finished`); `resume` gathers it again."""
        input = self._input
        assert input is not None
        run = workflow.info().workflow_id
        roots = [rollout_id(run, group.group_id, index) for index in range(input.group_size)]
        handle = await workflow.start_child_workflow(
            RolloutTreeWorkflow.run,
            RolloutTreeInput(
                rollout=self._rollout_input(group, 0, None, notify=False),
                root_ids=roots,
                branch=input.branch,
                resume=resume,
                notify=run,
            ),
            id=f"{run}/{group.group_id}/tree",
            task_queue=workflow.info().task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            parent_close_policy=ParentClosePolicy.ABANDON,
        )
        group.tree_run = handle.first_execution_run_id
        group.tree_attempts += 1
        self._state.figures.rollouts_started += 0 if resume else input.group_size
        self._watching.add(asyncio.ensure_future(self._watch_tree(handle, group, roots)))

    async def _watch_tree(self, handle: workflow.ChildWorkflowHandle, group: GroupRun, roots: list[str]) -> None:
        input = self._input
        assert input is not None
        try:
            tree = RolloutTreeResult.model_validate(await handle)
        except ChildWorkflowError as err:
            tree = RolloutTreeResult(
                results=[
                    result_from_failure(err, root, input.env, group.item, index) for index, root in enumerate(roots)
                ],
                nodes=[],
            )
        except asyncio.CancelledError:
            return
        self._state.trees.append(tree)

    async def _start_rollout(self, group: GroupRun, index: int, resume_from: str | None) -> None:
        input = self._input
        assert input is not None
        run = workflow.info().workflow_id
        handle = await workflow.start_child_workflow(
            TrajectoryWorkflow.run,
            self._rollout_input(group, index, resume_from, notify=True),
            id=rollout_id(run, group.group_id, index),
            task_queue=workflow.info().task_queue,
            id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
            parent_close_policy=ParentClosePolicy.ABANDON,
            search_attributes=TypedSearchAttributes(
                [
                    SearchAttributePair(sa.ENV, input.env),
                    SearchAttributePair(sa.BATCH_ID, run),
                    SearchAttributePair(sa.ITEM_ID, group.item.id),
                ]
            ),
        )
        group.runs[index] = handle.first_execution_run_id
        group.attempts[index] += 1
        self._state.figures.rollouts_started += 1
        self._watching.add(asyncio.ensure_future(self._watch(handle, group, index)))

    async def _watch(self, handle: workflow.ChildWorkflowHandle, group: GroupRun, index: int) -> None:
        """A rollout started by this run tells it how it ended through its result too, so one that ended
        without signalling (terminated, timed out) is heard at once; the inbox drops news heard twice."""
        input = self._input
        assert input is not None
        try:
            result = TrajectoryResult.model_validate(await handle)
        except ChildWorkflowError as err:
            result = result_from_failure(err, handle.id, input.env, group.item, index)
        except asyncio.CancelledError:
            return
        self._state.inbox.append(result.model_copy(update={"run_id": handle.first_execution_run_id}))

    async def _resume_due(self) -> None:
        """Start again the rollouts whose wait after a machinery failure is over."""
        now = workflow.time()
        for group in list(self._state.groups.values()):
            for index, when in sorted(group.resume_at.items()):
                if when <= now:
                    del group.resume_at[index]
                    if index == TREE:
                        await self._start_tree(group, resume=True)
                    else:
                        await self._start_rollout(group, index, resume_from=group.resume_from.pop(index, None))

    def _next_resume_in(self) -> float | None:
        due = [when for group in self._state.groups.values() for when in group.resume_at.values()]
        return max(min(due) - workflow.time(), 0.0) if due else None

    async def _item(self, index: int) -> Item:
        input = self._input
        assert input is not None
        position = input.item_offset + index
        if self._item_count:
            position %= self._item_count
        if not self._page_start <= position < self._page_start + len(self._page):
            count = ITEM_PAGE if self._item_count is None else min(ITEM_PAGE, self._item_count - position)
            loaded = await workflow.execute_activity_method(
                EnvActivities.load_items,
                LoadItemsInput(env=input.env, env_config=input.env_config, count=max(count, 1), offset=position),
                **params.LOAD_ITEMS.options(),
            )
            self._page, self._page_start = loaded.items, position
        return self._page[position - self._page_start]

    # ------------------------------------------------------------------ results

    async def _take_inbox(self) -> None:
        state = self._state
        while state.inbox:
            result = state.inbox.pop(0)
            await self._finish(result)
        while state.trees:
            await self._finish_tree(state.trees.pop(0))
        for group_id in [g.group_id for g in state.groups.values() if all(r is not None for r in g.results)]:
            if not self._may_post():
                break  # the oldest go first when run-api has room again
            await self._post(state.groups.pop(group_id))

    async def _finish(self, result: TrajectoryResult) -> None:
        input, state = self._input, self._state
        assert input is not None
        try:
            group_id, index = _place(result.rollout_id)
        except ValueError:
            return
        group = state.groups.get(group_id)
        if group is None or index >= len(group.results) or group.results[index] is not None:
            return  # a group given up, or news already heard
        if group.runs[index] is None or (result.run_id is not None and result.run_id != group.runs[index]):
            return  # an earlier run of a rollout that was resumed since, or waits to be
        figures = state.figures
        if not result.failed:
            group.results[index] = result
            figures.rollouts_finished += 1
            figures.tokens_generated += result.completion_tokens
            figures.turns_finished += result.turns
            return
        if result.stop_reason in RETRIED_STOPS and group.attempts[index] <= input.max_retries:
            figures.rollouts_retried += 1
            delay = min(input.retry_backoff_s * 2 ** (group.attempts[index] - 1), MAX_BACKOFF_S)
            workflow.logger.info("resuming %s in %.0fs after %s", result.rollout_id, delay, result.stop_reason.value)
            group.runs[index] = None
            group.resume_at[index], group.resume_from[index] = workflow.time() + delay, result.run_id
            return
        figures.tokens_generated += result.completion_tokens  # the work of a rollout given up, lost
        spent = "retries_spent" if result.stop_reason in RETRIED_STOPS else "failed"
        await self._give_up(group, f"{spent}:{result.stop_reason.value}")

    async def _finish_tree(self, tree: RolloutTreeResult) -> None:
        """A branching group's tree ended: its rollouts are the group; failures of the machinery resume the tree."""
        input, state = self._input, self._state
        assert input is not None
        try:
            group_id, _ = _place(tree.results[0].rollout_id)
        except (IndexError, ValueError):
            return
        group = state.groups.get(group_id)
        if group is None or group.tree_run is None:
            return  # given up, or news already heard (its signal and its result both tell)
        figures = state.figures
        failed = {r.stop_reason for r in tree.results if r.failed}
        group.tree_run = None
        if not failed:
            group.results = list(tree.results)
            figures.rollouts_started += len(tree.results) - input.group_size  # the branches it made
            figures.rollouts_finished += len(tree.results)
            figures.tokens_generated += sum(r.completion_tokens for r in tree.results)
            figures.turns_finished += sum(r.turns for r in tree.results)
            return
        if failed <= RETRIED_STOPS and group.tree_attempts <= input.max_retries:
            figures.rollouts_retried += sum(1 for r in tree.results if r.failed)
            delay = min(input.retry_backoff_s * 2 ** (group.tree_attempts - 1), MAX_BACKOFF_S)
            group.resume_at[TREE] = workflow.time() + delay
            return
        spent = "retries_spent" if failed <= RETRIED_STOPS else "failed"
        await self._give_up(group, f"{spent}:{sorted(r.value for r in failed)[0]}")

    async def _give_up(self, group: GroupRun, reason: str) -> None:
        """Count the group as dropped, and cancel its rollouts still running (their work can no longer count)."""
        self._state.groups.pop(group.group_id, None)
        self._state.figures.drop(reason)
        workflow.logger.warning("gave up group %s of item %s: %s", group.group_id, group.item.id, reason)
        run = workflow.info().workflow_id
        for index, result in enumerate(group.results):
            if result is None and group.runs[index] is not None:
                handle = workflow.get_external_workflow_handle(
                    rollout_id(run, group.group_id, index), run_id=group.runs[index]
                )
                try:
                    await handle.cancel()
                except Exception as err:  # noqa: BLE001  (already closed: nothing to cancel)
                    workflow.logger.info("could not cancel %s: %s", handle.id, err)

    async def _post(self, group: GroupRun) -> None:
        input, state = self._input, self._state
        assert input is not None
        self._phase = "posting"
        results = [r for r in group.results if r is not None]
        try:
            outcome = await workflow.execute_activity_method(
                FeedActivities.post_feed_group,
                FeedGroupInput(
                    run=workflow.info().workflow_id,
                    group_id=f"{workflow.info().workflow_id}/{group.group_id}",
                    results=results,
                    policy=input.policy,
                    tokenizer=input.tokenizer,
                    sink=input.sink,
                    output=state.output,
                    door_key=group_key(workflow.info().workflow_id, group.group_id) if input.sink == "door" else None,
                    api_url=self._api_url(),
                    env_id=state.trainer.env_id,
                    max_token_length=input.max_token_length,
                    max_staleness=input.max_staleness,
                    stale_groups=input.stale_groups,
                    prefix_tokens=input.branch.prefix_tokens if input.branch else None,
                ),
                **params.POST_FEED_GROUP.options(),
            )
        except ActivityError as err:
            state.figures.drop("not_posted")
            workflow.logger.error("group %s could not be posted: %s", group.group_id, err.cause or err)
            return
        figures = state.figures
        if outcome.status == "dropped":
            figures.drop(outcome.reason or "dropped")
            return
        if outcome.status == "already_posted":
            figures.groups_duplicated += 1
        figures.groups_posted += 1
        if input.sink == "atropos" and outcome.status == "posted":
            state.trainer.queued += 1
            self._posts += 1
        if input.sink == "door":
            state.door.pending.append(
                DoorGroup(
                    group_id=f"{workflow.info().workflow_id}/{group.group_id}",
                    key=group_key(workflow.info().workflow_id, group.group_id),
                    item=group.item,
                    sequences=len(results),
                    tokens=outcome.tokens_posted,
                    completion_tokens=sum(r.completion_tokens for r in results),
                    versions=[r.policy_versions for r in results],
                    started_step=group.started_step,
                    requeues=group.requeues,
                )
            )
        figures.tokens_posted += outcome.tokens_posted
        figures.turns_posted += outcome.turns
        figures.rollouts_masked += outcome.masked
        figures.groups_stale += outcome.reason == "stale"
        if outcome.staleness is not None:
            key = str(outcome.staleness)
            figures.staleness[key] = figures.staleness.get(key, 0) + 1

    async def _check_rollouts(self) -> None:
        self._checked_at = workflow.time()
        run = workflow.info().workflow_id
        waiting = {
            rollout_id(run, g.group_id, i): g.runs[i]
            for g in self._state.groups.values()
            for i, r in enumerate(g.results)
            if r is None and g.runs[i] is not None
        }
        if not waiting:
            return
        closed = await workflow.execute_activity_method(
            FeedActivities.check_feed_rollouts, RunsToCheck(runs=waiting), **params.CHECK_FEED_ROLLOUTS.options()
        )
        for result in closed:
            if result.stop_reason == StopReason.CANCELLED and not self._state.stopping:
                result = result.model_copy(update={"stop_reason": StopReason.TERMINATED})  # cancelled from outside
            self._state.inbox.append(result)

    async def _cancel_in_flight(self) -> None:
        self._phase = "cancelling"
        for group in list(self._state.groups.values()):
            await self._give_up(group, "stopped")

    # ------------------------------------------------------------------ waiting

    async def _trainer(
        self, wait_s: float, after_step: int | None = None, after_version: int | None = None
    ) -> TrainerView:
        input, state = self._input, self._state
        assert input is not None
        return await workflow.execute_activity_method(
            FeedActivities.trainer_view,
            TrainerQuery(
                run=workflow.info().workflow_id,
                api_url=self._api_url(),
                env_id=state.trainer.env_id,
                group_size=input.group_size,
                max_token_length=input.max_token_length,
                env_weight=input.env_weight,
                after_step=after_step,
                after_version=after_version,
                policy=input.policy,
                wait_s=wait_s,
            ),
            **params.TRAINER_VIEW.options(),
        )

    async def _wait(self) -> None:
        """Until a rollout ends, a stop, or (when the trainer holds admission back) the trainer steps."""
        input, state = self._input, self._state
        assert input is not None
        running = any(r is None for g in state.groups.values() for r in g.results)
        self._phase = "waiting for rollouts" if running else "waiting for the trainer"
        blocked = input.sink == "atropos" and (
            (self._wants_more() and not self._admitted()) or (self._held() and not self._may_post())
        )
        if blocked and self._waiter is None:
            self._waiter_posts = self._posts
            self._waiter = asyncio.ensure_future(
                self._trainer(
                    TRAINER_WAIT_S, after_step=state.trainer.current_step, after_version=state.trainer.policy_version
                )
            )
        waiter = self._waiter
        door_seen = self._door_changes
        wait_s = min(
            CHECK_ROLLOUTS_S, self._next_resume_in() if self._next_resume_in() is not None else CHECK_ROLLOUTS_S
        )
        try:
            await workflow.wait_condition(
                lambda: (
                    bool(state.inbox)
                    or bool(state.trees)
                    or self._stop_now
                    or (waiter is not None and waiter.done())
                    or self._door_changes != door_seen
                    or (state.stopping and (not state.groups or self._held()) and self._door_settled())
                ),
                timeout=timedelta(seconds=max(wait_s, 0.001)),
            )
        except TimeoutError:
            pass
        if waiter is not None and waiter.done():
            self._waiter = None
            try:
                await self._take_view(waiter.result())
            except ActivityError as err:
                workflow.logger.warning("could not ask run-api about the trainer: %s", err.cause or err)

    def _door_settled(self) -> bool:
        """Nothing left at the door (or no door): a draining run waits for acknowledgements, not a loop."""
        assert self._input is not None
        return self._input.sink != "door" or self._state.door.is_empty()

    async def _take_view(self, view: TrainerView) -> None:
        """The waiter's view. Its queue was read at some moment while it waited: a group this run posted
        meanwhile may or may not be in it, and taken as read it could let a second batch queue in run-api
        (staler than the bound once run-api hands out the newest first). Then run-api is asked again, at
        once: posting happens only in this loop, so nothing lands during that question. If that fails, the
        view this run kept (which counts its posts) stays."""
        if self._posts != self._waiter_posts:
            try:
                view = await self._trainer(wait_s=0)
            except ActivityError as err:
                workflow.logger.warning("could not ask run-api about the trainer again: %s", err.cause or err)
                return
        self._state.trainer = view
        self._viewed_at = workflow.time()

    async def _continue_as_new(self) -> None:
        input = self._input
        assert input is not None
        self._phase = "continuing as new"
        if self._waiter is not None:
            await asyncio.wait([self._waiter])
            if not self._waiter.cancelled() and self._waiter.exception() is None:
                await self._take_view(self._waiter.result())
        await workflow.wait_condition(workflow.all_handlers_finished)
        workflow.continue_as_new(
            input.model_copy(update={"state": self._state}), initial_versioning_behavior=continue_on_current_build()
        )

    def _api_url(self) -> str | None:
        return self._state.api_url


@contextlib.contextmanager
def _door_errors() -> Iterator[None]:
    """A refused take, acknowledgement or registration fails the Update with the ledger's words, never the run."""
    try:
        yield
    except DoorError as err:
        raise ApplicationError(str(err), type="DoorError", non_retryable=True) from None


def _started(input: FeedInput | None) -> FeedInput:
    """An Update heard before the run's first line (a new run, or the next one after continue-as-new, whose
    state is not in place yet) is refused without being recorded; the endpoint answers 503 and the trainer's
    client asks again."""
    if input is None:
        raise ApplicationError("the run is starting", type="RunStarting")
    return input
