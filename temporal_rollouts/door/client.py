"""What a trainer imports to pull a training run's batches from the door: httpx and nothing else of
the project, so a trainer's environment needs no worker dependencies.

    from temporal_rollouts.door.client import DoorClient

    door = DoorClient("http://127.0.0.1:8780")          # key: ROLLOUTS_DOOR_KEY, or api_key=
    door.register("qwen-tt", batch_size=64)              # sequences per batch (whole groups)
    for batch in door.batches("qwen-tt"):
        for sequence in batch.sequences():               # tokens, masks, logprobs, score, versions, ...
            ...
        train_step(batch.groups)                         # atroposlib's ScoredDataGroup dicts, as run-api gives
        publish_weights(step)                            # the server serves them as version `step`
        batch.ack()                                      # after publishing: pacing counts acknowledgements

Delivery is at least once: a batch not acknowledged within its lease (`lease_s`) is handed out
again, whole and with the same number; an acknowledged batch never is. So a trainer that dies
mid-batch and starts again from its last checkpoint gets the batch it did not finish, and
`acknowledged_below` tells it how far the run has come. Acknowledge after the new weights are
served: the run counts the trainer's version as one per acknowledged batch (or what
`trainer_version` says), and both admission and the staleness bound read it.

Network errors and 503s (no worker answered, an endpoint restarting) are retried with backoff;
a retried take carries the same request id, so the run answers it with the batch it already
handed out instead of leasing a second one.
"""

from __future__ import annotations

import os
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

KEY_ENV = "ROLLOUTS_DOOR_KEY"
IGNORE_INDEX = -100
RETRIED_STATUS = {502, 503, 504}


class DoorClientError(RuntimeError):
    """The door refused a request; `status` is its HTTP status."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status


class RunEnded(DoorClientError):
    """The run is done and every batch it made is acknowledged (HTTP 410)."""


@dataclass
class Sequence:
    """One rollout of a batch, as a trainer weighs it."""

    tokens: list[int]
    masks: list[int]
    """-100 where the token is not trained (prompt, tool output, template), else the token id."""
    logprobs: list[float]
    """The inference logprob of each token (1.0 where masked, atroposlib's convention)."""
    score: float
    versions: list[int | None]
    """Per model turn, the version of the weights that produced it (None: the server did not say)."""
    group_id: str
    rollout_id: str | None = None
    parent: str | None = None
    """The rollout this one branched from (a group that is a tree), and after which turn."""
    branch_turn: int | None = None
    prefix_tokens: int = 0
    stale: bool = False
    """Its group is staler than the run's bound (handed over marked, as the run's stale_groups says)."""

    def trainable(self) -> list[int]:
        """Positions of the tokens to train (mask != -100)."""
        return [i for i, mask in enumerate(self.masks) if mask != IGNORE_INDEX]


@dataclass
class Batch:
    run: str
    number: int
    lease: str
    deadline: float
    """When the lease ends (seconds since the epoch); past it the batch is handed out again."""
    deliveries: int
    """1 the first time; more when it was handed out before and not acknowledged."""
    trainer_version: int
    """The trainer's version the run decided staleness against when it formed the batch."""
    final: bool
    """Short of a full batch: the run's last groups."""
    groups: list[dict[str, Any]]
    """atroposlib's ScoredDataGroup fields (tokens, masks, scores, inference_logprobs, overrides,
    group_overrides, messages) plus `metadata`: what run-api's /batch gives, with the door's marks in
    `group_overrides` (group_id, staleness, stale, masked, batch)."""
    _client: DoorClient = field(repr=False, default=None)  # type: ignore[assignment]

    def sequences(self) -> list[Sequence]:
        found = []
        for group in self.groups:
            overrides = group.get("overrides") or [{} for _ in group["tokens"]]
            marks = group.get("group_overrides") or {}
            logprobs = group.get("inference_logprobs") or [[1.0] * len(t) for t in group["tokens"]]
            for tokens, masks, lps, score, extra in zip(
                group["tokens"], group["masks"], logprobs, group["scores"], overrides, strict=True
            ):
                found.append(
                    Sequence(
                        tokens=tokens,
                        masks=masks,
                        logprobs=lps,
                        score=score,
                        versions=list(extra.get("policy_versions") or []),
                        group_id=marks.get("group_id", ""),
                        rollout_id=extra.get("rollout_id"),
                        parent=extra.get("parent"),
                        branch_turn=extra.get("branch_turn"),
                        prefix_tokens=extra.get("prefix_tokens") or 0,
                        stale=bool(marks.get("stale")),
                    )
                )
        return found

    @property
    def scores(self) -> list[float]:
        return [score for group in self.groups for score in group["scores"]]

    def ack(self) -> str:
        """Acknowledge: the batch is trained (and its weights served). Safe to call again."""
        return self._client.ack(self.run, self.number, self.lease)

    def release(self) -> None:
        """Give the batch back untrained: it is handed out again at the next take."""
        self._client.release(self.run, self.number, self.lease)


class DoorClient:
    def __init__(
        self,
        url: str,
        api_key: str | None = None,
        *,
        consumer: str = "default",
        timeout_s: float = 60.0,
        retry_for_s: float = 600.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        key = api_key if api_key is not None else os.environ.get(KEY_ENV)
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self._http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s, transport=transport)
        self.consumer = consumer
        self.retry_for_s = retry_for_s
        """How long network errors and 503s are retried before one is raised."""

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> DoorClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, run: str, batch_size: int, starting_step: int = 0) -> dict[str, Any]:
        """Say the run's batch size (sequences, whole groups; the run may have it already) and the version the
        trainer starts from. The run's door status back."""
        return self._call("POST", f"/runs/{run}/register", {"batch_size": batch_size, "starting_step": starting_step})

    def status(self, run: str) -> dict[str, Any]:
        """The run's figures, its trainer and its door (`door`: batch size, pending groups, batches out, ...)."""
        return self._call("GET", f"/runs/{run}")

    def metrics(self, run: str) -> dict[str, float]:
        """The run's door as wandb-style metrics (`door/batches_acknowledged`, ...), to log with the trainer's own."""
        door = self.status(run).get("door")
        return door_metrics(door) if door else {}

    def take(self, run: str, *, lease_s: float = 600.0, trainer_version: int | None = None) -> Batch | None:
        """The next batch, leased for `lease_s`; None while the run has no full batch stored. RunEnded when
        the run is done and everything is acknowledged."""
        body = {
            "consumer": self.consumer,
            "lease_s": lease_s,
            "trainer_version": trainer_version,
            "request_id": f"take-{uuid.uuid4().hex}",
        }
        answer = self._call("POST", f"/runs/{run}/take", body)
        batch = answer.get("batch")
        if batch is None:
            return None
        return Batch(
            run=run,
            number=batch["number"],
            lease=batch["lease"],
            deadline=batch["deadline"],
            deliveries=batch["deliveries"],
            trainer_version=batch["trainer_version"],
            final=batch["final"],
            groups=batch["groups"],
            _client=self,
        )

    def batches(
        self,
        run: str,
        *,
        lease_s: float = 600.0,
        poll_s: float = 1.0,
        trainer_version: int | Callable[[], int | None] | None = None,
    ) -> Iterator[Batch]:
        """Batch after batch until the run is done and every batch is acknowledged; waits (`poll_s`) while
        none is ready. `trainer_version`: the version of the weights being trained, or a function giving it
        at each take; unset, the run counts one version per acknowledged batch."""
        while True:
            version = trainer_version() if callable(trainer_version) else trainer_version
            try:
                batch = self.take(run, lease_s=lease_s, trainer_version=version)
            except RunEnded:
                return
            if batch is None:
                time.sleep(poll_s)
                continue
            yield batch

    def ack(self, run: str, number: int, lease: str) -> str:
        return self._call("POST", f"/runs/{run}/batches/{number}/ack", {"lease": lease})["status"]

    def release(self, run: str, number: int, lease: str) -> None:
        self._call("POST", f"/runs/{run}/batches/{number}/release", {"lease": lease})

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        deadline, delay = time.monotonic() + self.retry_for_s, 0.5
        while True:
            try:
                response = self._http.request(method, path, json=body)
            except httpx.TransportError:
                if time.monotonic() >= deadline:
                    raise
            else:
                if response.status_code < 400:
                    return response.json()
                if response.status_code not in RETRIED_STATUS or time.monotonic() >= deadline:
                    message = _message(response)
                    raise (RunEnded if response.status_code == 410 else DoorClientError)(response.status_code, message)
            time.sleep(delay)
            delay = min(delay * 2, 10.0)


def door_metrics(door: dict[str, Any]) -> dict[str, float]:
    """A run's door status (`status(run)["door"]`) as flat metrics: batches taken, acknowledged and re-delivered,
    leases expired, groups and tokens acknowledged, stale groups, the trainer's version, the largest staleness."""
    figures = door["figures"]
    metrics = {f"door/{name}": float(value) for name, value in figures.items() if isinstance(value, int | float)}
    metrics["door/trainer_version"] = float(door["trainer_version"])
    metrics["door/batches_out"] = float(door["batches_out"])
    metrics["door/pending_groups"] = float(door["pending_groups"])
    if figures["staleness"]:
        metrics["door/max_staleness_consumed"] = float(max(int(k) for k in figures["staleness"]))
    return metrics


def _message(response: httpx.Response) -> str:
    try:
        return str(response.json()["error"]["message"])
    except (ValueError, KeyError, TypeError):
        return response.text[:300]
