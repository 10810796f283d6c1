"""The turns and timings of closed rollout runs, read once for the page's figures.

A closed run's result never changes, so each is read from Temporal once and kept (by run
id). A page asking for the figures of a thousand-rollout batch does not wait for a thousand
reads: it gets what is known after a short wait, and the reads go on so the next refresh
knows more.
"""

from __future__ import annotations

import asyncio
import logging

from temporalio.client import Client

from temporal_rollouts.client.rollout_rows import (
    READ_CONCURRENCY,
    RolloutOutcome,
    RolloutRow,
    read_outcome,
)

log = logging.getLogger(__name__)

MAX_KEPT = 100_000
"""Outcomes kept at most (each is a few numbers); the oldest go first."""


class OutcomeCache:
    def __init__(self, client: Client, max_kept: int = MAX_KEPT) -> None:
        self._client = client
        self._max_kept = max_kept
        self._known: dict[str, RolloutOutcome | None] = {}
        self._reading: dict[str, asyncio.Task[None]] = {}
        self._slots = asyncio.Semaphore(READ_CONCURRENCY)

    async def outcomes(self, rows: list[RolloutRow], wait_s: float) -> tuple[dict[str, RolloutOutcome], int]:
        """(outcome by rollout id of the closed runs among `rows` known within `wait_s`, reads still going)."""
        closed = [row for row in rows if row.status != "running"]
        waiting = [self._read(row) for row in closed if row.run_id not in self._known]
        if waiting:
            await asyncio.wait(waiting, timeout=wait_s)
        found = {row.rollout_id: outcome for row in closed if (outcome := self._known.get(row.run_id)) is not None}
        return found, sum(1 for row in closed if row.run_id not in self._known)

    def _read(self, row: RolloutRow) -> asyncio.Task[None]:
        task = self._reading.get(row.run_id)
        if task is None:
            task = self._reading[row.run_id] = asyncio.create_task(self._fetch(row))
        return task

    async def _fetch(self, row: RolloutRow) -> None:
        outcome = None
        try:
            async with self._slots:
                outcome = await read_outcome(self._client, row)
        except Exception as err:  # noqa: BLE001  an unreadable result is left out of the figures, not retried forever
            log.warning("cannot read the result of %s (run %s): %s", row.rollout_id, row.run_id, err)
        finally:
            self._keep(row.run_id, outcome)
            self._reading.pop(row.run_id, None)

    def _keep(self, run_id: str, outcome: RolloutOutcome | None) -> None:
        self._known[run_id] = outcome
        while len(self._known) > self._max_kept:
            del self._known[next(iter(self._known))]
