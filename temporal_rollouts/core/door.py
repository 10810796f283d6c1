"""The trainer door's ledger: finished groups, numbered batches, leases and acknowledgements.

A training run with `sink: door` keeps no queue in any process: its workflow state holds this
ledger (small: object keys, counts and versions) and each group's tokens sit in the object store
under the key the ledger names. A trainer takes batches through the door's endpoint, which turns
each take and acknowledgement into a workflow Update, so every change to the ledger is durable
and strongly ordered, whichever endpoint process sent it.

- **Numbered batches**, 0, 1, 2, ... in the order they are formed; a batch keeps its number and
  its groups for life, so a trainer that restarts knows where it stands (`acknowledged_below`).
- **At-least-once, acknowledged.** A taken batch is leased until a deadline; one not
  acknowledged by then is handed out again, whole, and counted (`redelivered`). An acknowledged
  batch is never handed out again, and acknowledging it again is answered, not counted twice.
- **Staleness at consumption.** A batch is formed when a trainer takes it, from the groups
  whose oldest tokens are the oldest first, against the version of the weights the trainer is
  training now: a group staler than `max_staleness` is dropped, re-queued for a fresher start,
  or handed over marked (`stale_groups`), never silently trained.

Time is passed in (the workflow's clock), so the ledger is deterministic and tested on its own.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from temporal_rollouts.core.tasks import Item


class StaleGroups(StrEnum):
    """What happens to a group that is staler than `max_staleness` when it would reach the trainer."""

    POST = "post"
    """Hand it over marked: `group_overrides.stale` is true and its staleness counted (run-api: posted with
    its versions in `overrides` / `group_overrides` for the trainer to weigh or filter)."""
    SCORES_ONLY = "scores_only"
    """Hand it over marked with the stale rollouts' tokens masked: their scores still count in the group's
    advantages."""
    DROP = "drop"
    """Hold it back from training and count it (`dropped["stale"]`); its group stays in the object store."""
    REQUEUE = "requeue"
    """Start its item again as a fresh group (at most `max_retries` times, then drop it); counted. The door
    only: run-api has taken a group once it is posted."""


class DoorGroup(BaseModel):
    """A finished group in the object store, waiting for a batch or in one."""

    group_id: str = Field(description="`<run>/g<n>`, as the group's `group_overrides.group_id` says.")
    key: str = Field(description="Its object key (the group's JSON, as atroposlib's ScoredDataGroup plus metadata).")
    item: Item
    sequences: int
    tokens: int = Field(description="Trainable tokens (mask != -100).")
    completion_tokens: int = Field(default=0, description="Tokens its rollouts generated.")
    versions: list[list[int | None]] = Field(description="Per sequence, the policy version of each model turn.")
    started_step: int = Field(description="The trainer's version when the group started.")
    requeues: int = 0

    def oldest(self) -> int:
        """The oldest weights that can have made its tokens: the oldest version a turn reports, else the
        trainer's version when the group started (a trainer acknowledges after publishing, so the weights
        served from then on were at least that)."""
        known = [v for sequence in self.versions for v in sequence if v is not None]
        return min(known) if known else self.started_step

    def stale_sequences(self, version: int, bound: int) -> list[int]:
        """Sequences with a turn more than `bound` versions behind `version`."""
        return [
            index
            for index, turns in enumerate(self.versions)
            if any(v is not None and version - v > bound for v in turns)
            or (all(v is None for v in turns) and version - self.started_step > bound)
        ]


class BatchGroup(BaseModel):
    group: DoorGroup
    staleness: int = Field(description="Trainer version at forming minus the group's oldest version.")
    stale: bool = False
    masked: list[int] = Field(default_factory=list, description="Sequences whose tokens are masked (scores_only).")
    held_back: bool = Field(
        default=False,
        description="Staler than the bound when its batch went out again: every token masked and counted as "
        "held back, not acknowledged (drop, requeue).",
    )


class DoorBatch(BaseModel):
    number: int
    groups: list[BatchGroup]
    trainer_version: int = Field(
        description="The weights the trainer trains from, as of the batch's last delivery: staleness is decided "
        "against it when the batch is formed, and again when it goes out again to a trainer that moved on."
    )
    deliveries: int = 0
    lease: str | None = Field(default=None, description="The current lease; None: waiting to be handed out again.")
    deadline: float | None = Field(default=None, description="When the lease ends (workflow time, seconds).")
    consumer: str | None = None
    short: bool = Field(default=False, description="Formed with fewer groups than a batch: the run's last.")

    @property
    def sequences(self) -> int:
        return sum(g.group.sequences for g in self.groups)


class DoorFigures(BaseModel):
    """What the door has handed out and heard back (query `status`, `rollouts train status`, wandb)."""

    batches_formed: int = 0
    batches_taken: int = 0
    """Deliveries, first and repeated."""
    batches_redelivered: int = 0
    """Deliveries of a batch that had been handed out before (lease expired or given back)."""
    batches_acknowledged: int = 0
    leases_expired: int = 0
    batches_released: int = 0
    """Batches a trainer gave back without training them."""
    acks_repeated: int = 0
    """Acknowledgements of a batch already acknowledged (answered, not counted twice)."""
    groups_acknowledged: int = 0
    sequences_acknowledged: int = 0
    tokens_acknowledged: int = 0
    completion_tokens_acknowledged: int = 0
    groups_marked_stale: int = 0
    groups_requeued: int = 0
    groups_dropped_stale: int = 0
    completion_tokens_held_back: int = 0
    """Generated tokens of the groups re-queued or dropped for staleness: generated, never trained."""
    staleness: dict[str, int] = Field(default_factory=dict)
    """Groups handed out by their staleness at consumption (trainer version minus oldest token version)."""


class TakeRequest(BaseModel):
    consumer: str = Field(default="default", max_length=200, description="Who takes: a trainer's name.")
    lease_s: float = Field(default=600.0, gt=0, le=7 * 24 * 3600, description="How long the batch is leased.")
    trainer_version: int | None = Field(
        default=None, ge=0, description="The weights the trainer trains from; unset: starting step + acknowledged."
    )
    ack_previous: bool = Field(
        default=False, description="Acknowledge the batch this consumer took last (Atropos' /batch has no ack)."
    )


class Delivery(BaseModel):
    """A batch handed out: its number, lease and groups (their tokens are in the object store)."""

    number: int
    lease: str
    deadline: float
    deliveries: int
    trainer_version: int
    groups: list[BatchGroup]
    final: bool = False
    """Formed short of a full batch because the run has nothing more coming."""


class TakeAnswer(BaseModel):
    batch: Delivery | None = None
    acknowledged_below: int = Field(description="Every batch numbered below this is acknowledged.")
    next_number: int
    requeue: list[DoorGroup] = Field(default_factory=list, description="Groups to start again (for the workflow).")


class AckRequest(BaseModel):
    number: int = Field(ge=0)
    lease: str = Field(max_length=200)


class AckAnswer(BaseModel):
    status: str = Field(description="`acknowledged`, or `already_acknowledged`.")
    number: int
    acknowledged_below: int


class ReleaseRequest(BaseModel):
    number: int = Field(ge=0)
    lease: str = Field(max_length=200)


class RegisterRequest(BaseModel):
    """A trainer saying its batch size (in sequences, whole groups) and the step it starts from."""

    batch_size: int = Field(gt=0, le=1_000_000)
    starting_step: int = Field(default=0, ge=0)


class DoorError(ValueError):
    """A take, acknowledgement or registration the ledger refuses; the message says why."""


class TakeRules(BaseModel):
    """The run's settings a take is decided by."""

    per_batch: int = Field(description="Groups in one batch.")
    max_staleness: int
    stale_groups: StaleGroups
    max_requeues: int
    final: bool = Field(description="No more groups are coming: a batch may be formed short.")


class DoorLedger(BaseModel):
    batch_size: int = Field(default=0, description="Sequences per batch (whole groups); 0 until a trainer says.")
    starting_step: int = 0
    pending: list[DoorGroup] = Field(default_factory=list, description="Finished groups in no batch yet.")
    batches: list[DoorBatch] = Field(default_factory=list, description="Formed and not acknowledged.")
    next_number: int = 0
    acknowledged_below: int = 0
    acknowledged_above: list[int] = Field(
        default_factory=list, description="Acknowledged batches numbered at or above acknowledged_below."
    )
    last_taken: dict[str, int] = Field(default_factory=dict, description="Consumer -> the batch it took last.")
    figures: DoorFigures = Field(default_factory=DoorFigures)

    # ------------------------------------------------------------------ what the run reads

    @property
    def acknowledged(self) -> int:
        return self.acknowledged_below + len(self.acknowledged_above)

    def trainer_version(self) -> int:
        """The weights the trainer trains from now, when it does not say: one version per acknowledged batch."""
        return self.starting_step + self.acknowledged

    def waiting_groups(self) -> int:
        """Groups stored and not yet acknowledged: pending, or in a batch handed out or to be handed out again."""
        return len(self.pending) + sum(len(batch.groups) for batch in self.batches)

    def is_empty(self) -> bool:
        return not self.pending and not self.batches

    def is_acknowledged(self, number: int) -> bool:
        return number < self.acknowledged_below or number in self.acknowledged_above

    # ------------------------------------------------------------------ changes

    def register(self, request: RegisterRequest) -> None:
        if self.batch_size and request.batch_size != self.batch_size:
            raise DoorError(
                f"this run's batches are {self.batch_size} sequences; a trainer asked for {request.batch_size}"
            )
        self.batch_size = request.batch_size
        if self.next_number == 0:
            self.starting_step = request.starting_step

    def may_take(self, request: TakeRequest, now: float, rules: TakeRules) -> bool:
        """Whether a take can hand anything out or change anything (a take that cannot is refused before it
        is recorded, so a trainer polling an empty door costs the run's history nothing)."""
        previous = self.last_taken.get(request.consumer)
        if request.ack_previous and previous is not None and not self.is_acknowledged(previous):
            return True
        if any(batch.lease is None or (batch.deadline or 0) <= now for batch in self.batches):
            return True
        if not self.pending:
            return False
        return len(self.pending) >= rules.per_batch or rules.final

    def take(self, request: TakeRequest, now: float, rules: TakeRules) -> TakeAnswer:
        if request.ack_previous and request.consumer in self.last_taken:
            previous = self.last_taken[request.consumer]
            if not self.is_acknowledged(previous):
                self._acknowledge(previous)
        self._expire(now)
        answer = TakeAnswer(acknowledged_below=self.acknowledged_below, next_number=self.next_number)
        version = request.trainer_version if request.trainer_version is not None else self.trainer_version()
        batch = next((b for b in self.batches if b.lease is None), None)
        if batch is not None:
            self._decide_again(batch, version, rules, answer.requeue)
        else:
            batch = self._form(version, rules, answer.requeue)
        if batch is not None:
            batch.deliveries += 1
            self.figures.batches_taken += 1
            if batch.deliveries > 1:
                self.figures.batches_redelivered += 1
            batch.lease = f"{batch.number}.{batch.deliveries}"
            batch.deadline = now + request.lease_s
            batch.consumer = request.consumer
            self.last_taken[request.consumer] = batch.number
            answer.batch = Delivery(
                number=batch.number,
                lease=batch.lease,
                deadline=batch.deadline,
                deliveries=batch.deliveries,
                trainer_version=batch.trainer_version,
                groups=batch.groups,
                final=batch.short,
            )
        answer.acknowledged_below, answer.next_number = self.acknowledged_below, self.next_number
        return answer

    def acknowledge(self, request: AckRequest) -> AckAnswer:
        if request.number >= self.next_number:
            raise DoorError(f"no batch {request.number} has been handed out (the next is {self.next_number})")
        if self.is_acknowledged(request.number):
            self.figures.acks_repeated += 1
            return AckAnswer(
                status="already_acknowledged", number=request.number, acknowledged_below=self.acknowledged_below
            )
        batch = self._batch(request.number)
        self._check_lease(batch, request.lease)
        self._acknowledge(request.number)
        return AckAnswer(status="acknowledged", number=request.number, acknowledged_below=self.acknowledged_below)

    def release(self, request: ReleaseRequest) -> None:
        """Give a batch back untrained: it is handed out again at the next take."""
        if self.is_acknowledged(request.number):
            raise DoorError(f"batch {request.number} is acknowledged: it cannot be given back")
        batch = self._batch(request.number)
        self._check_lease(batch, request.lease)
        if batch.lease == request.lease:
            batch.lease, batch.deadline = None, None
            self.figures.batches_released += 1

    # ------------------------------------------------------------------ inside

    def _batch(self, number: int) -> DoorBatch:
        found = next((b for b in self.batches if b.number == number), None)
        if found is None:
            raise DoorError(f"no batch {number} has been handed out (the next is {self.next_number})")
        return found

    @staticmethod
    def _check_lease(batch: DoorBatch, lease: str) -> None:
        """Any lease this batch was handed out under: a trainer whose lease ran out and that trained the batch
        anyway still acknowledges it (the batch was trained; it must not be handed out once more)."""
        number, _, delivery = lease.partition(".")
        if number != str(batch.number) or not delivery.isdigit() or not 1 <= int(delivery) <= batch.deliveries:
            raise DoorError(f"lease {lease!r} is not one of batch {batch.number}'s")

    def _expire(self, now: float) -> None:
        for batch in self.batches:
            if batch.lease is not None and batch.deadline is not None and batch.deadline <= now:
                batch.lease, batch.deadline = None, None
                self.figures.leases_expired += 1

    def _form(self, version: int, rules: TakeRules, requeue: list[DoorGroup]) -> DoorBatch | None:
        chosen: list[BatchGroup] = []
        for group in sorted(self.pending, key=lambda g: g.oldest()):  # stable: arrival order among equals
            staleness = version - group.oldest()
            if staleness <= rules.max_staleness:
                chosen.append(BatchGroup(group=group, staleness=staleness))
            elif rules.stale_groups == StaleGroups.REQUEUE and group.requeues < rules.max_requeues:
                self.pending.remove(group)
                self.figures.groups_requeued += 1
                self.figures.completion_tokens_held_back += group.completion_tokens
                requeue.append(group)
                continue
            elif rules.stale_groups in (StaleGroups.DROP, StaleGroups.REQUEUE):
                self.pending.remove(group)
                self.figures.groups_dropped_stale += 1
                self.figures.completion_tokens_held_back += group.completion_tokens
                continue
            else:
                masked = group.stale_sequences(version, rules.max_staleness)
                chosen.append(
                    BatchGroup(
                        group=group,
                        staleness=staleness,
                        stale=True,
                        masked=masked if rules.stale_groups == StaleGroups.SCORES_ONLY else [],
                    )
                )
            if len(chosen) == rules.per_batch:
                break
        if not chosen or (len(chosen) < rules.per_batch and not rules.final):
            return None
        for entry in chosen:
            self.pending.remove(entry.group)
            self.figures.groups_marked_stale += entry.stale
            self._count_staleness(entry.staleness, +1)
        batch = DoorBatch(
            number=self.next_number, groups=chosen, trainer_version=version, short=len(chosen) < rules.per_batch
        )
        self.next_number += 1
        self.batches.append(batch)
        self.figures.batches_formed += 1
        return batch

    def _decide_again(self, batch: DoorBatch, version: int, rules: TakeRules, requeue: list[DoorGroup]) -> None:
        """A batch going out again may meet a trainer that moved on (it acknowledged later batches while this
        one's lease ran): each group's staleness is decided again against the version trained now, so none is
        trained past the bound. The batch stays whole under its number; a group now too stale is marked, or
        masked (scores_only), or masked and held back whole (drop; requeue also starts its item again)."""
        if version <= batch.trainer_version:
            return
        batch.trainer_version = version
        figures = self.figures
        for entry in batch.groups:
            if entry.held_back:
                continue
            self._count_staleness(entry.staleness, -1)
            entry.staleness = version - entry.group.oldest()
            if entry.staleness <= rules.max_staleness or rules.stale_groups in (
                StaleGroups.POST,
                StaleGroups.SCORES_ONLY,
            ):
                self._count_staleness(entry.staleness, +1)  # handed over: consumed at this staleness
            if entry.staleness <= rules.max_staleness:
                continue
            figures.groups_marked_stale += not entry.stale
            entry.stale = True
            if rules.stale_groups == StaleGroups.SCORES_ONLY:
                entry.masked = entry.group.stale_sequences(version, rules.max_staleness)
            elif rules.stale_groups in (StaleGroups.DROP, StaleGroups.REQUEUE):
                entry.masked, entry.held_back = list(range(entry.group.sequences)), True
                figures.completion_tokens_held_back += entry.group.completion_tokens
                if rules.stale_groups == StaleGroups.REQUEUE and entry.group.requeues < rules.max_requeues:
                    figures.groups_requeued += 1
                    requeue.append(entry.group)
                else:
                    figures.groups_dropped_stale += 1

    def _count_staleness(self, staleness: int, change: int) -> None:
        key = str(staleness)
        self.figures.staleness[key] = self.figures.staleness.get(key, 0) + change
        if not self.figures.staleness[key]:
            del self.figures.staleness[key]

    def _acknowledge(self, number: int) -> None:
        batch = self._batch(number)
        self.batches.remove(batch)
        figures = self.figures
        figures.batches_acknowledged += 1
        trained = [g for g in batch.groups if not g.held_back]  # a held-back group's tokens are counted as such
        figures.groups_acknowledged += len(trained)
        figures.sequences_acknowledged += sum(g.group.sequences for g in trained)
        figures.tokens_acknowledged += sum(g.group.tokens for g in trained)
        figures.completion_tokens_acknowledged += sum(g.group.completion_tokens for g in trained)
        self.acknowledged_above.append(number)
        self.acknowledged_above.sort()
        while self.acknowledged_above and self.acknowledged_above[0] == self.acknowledged_below:
            self.acknowledged_above.pop(0)
            self.acknowledged_below += 1
