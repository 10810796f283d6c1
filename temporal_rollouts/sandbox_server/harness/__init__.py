"""Agent harnesses in slots: each slot may run one, with a model endpoint of its own (`process`, `endpoint`),
which the rollout's workflow serves through `POST /harness/{start,next,answer,stop}`."""

from __future__ import annotations

import asyncio
from pathlib import Path

from temporal_rollouts.sandbox_server.errors import HarnessGone
from temporal_rollouts.sandbox_server.harness.process import SlotHarness, start_harness, stop_harness
from temporal_rollouts.sandbox_server.isolation.bubblewrap import SlotSandbox
from temporal_rollouts.sandbox_server.schema import (
    HarnessAnswered,
    HarnessAnswerRequest,
    HarnessNext,
    HarnessNextRequest,
    HarnessStartRequest,
    HarnessState,
)

__all__ = ["SlotHarnesses"]


class SlotHarnesses:
    """The harnesses of one server's slots, by slot index; the caller has checked each request's lease."""

    def __init__(self) -> None:
        self._harnesses: dict[int, SlotHarness] = {}
        self._starting: dict[int, asyncio.Lock] = {}

    async def start(
        self,
        request: HarnessStartRequest,
        *,
        folder: Path,
        sandbox: SlotSandbox,
        bundle: Path | None,
    ) -> HarnessState:
        """Start it in `sandbox` (the lease's), or answer the state of the one this id already started (a
        retried start)."""
        async with self._starting.setdefault(request.slot, asyncio.Lock()):
            current = self._harnesses.get(request.slot)
            if (
                current is not None
                and current.harness_id == request.harness_id
                and current.lease_id == request.lease_id
            ):
                return current.state()
            await self.stop_slot(request.slot)
            harness = await start_harness(
                request,
                folder=folder,
                sandbox=sandbox,
                bundle=bundle,
            )
            self._harnesses[request.slot] = harness
            return harness.state(started=True)

    async def next(self, request: HarnessNextRequest) -> HarnessNext:
        harness = self._get(request.slot, request.harness_id, request.lease_id)
        pending = await harness.endpoint.next(request.wait_s, harness.ended)
        if pending is not None:
            return HarnessNext(request=pending)
        return HarnessNext(exit=harness.exit())

    def answer(self, request: HarnessAnswerRequest) -> HarnessAnswered:
        harness = self._get(request.slot, request.harness_id, request.lease_id)
        return HarnessAnswered(delivered=harness.endpoint.answer(request.request_id, request.status, request.body))

    async def stop(self, slot: int, harness_id: str, lease_id: str) -> HarnessState:
        harness = self._get(slot, harness_id, lease_id)
        await stop_harness(harness)
        return harness.state()

    async def stop_slot(self, slot: int) -> None:
        """The slot's lease ended (released, reset, expired): so does its harness."""
        harness = self._harnesses.pop(slot, None)
        if harness is not None:
            await stop_harness(harness)

    async def close(self) -> None:
        for slot in list(self._harnesses):
            await self.stop_slot(slot)

    def _get(self, slot: int, harness_id: str, lease_id: str) -> SlotHarness:
        harness = self._harnesses.get(slot)
        if harness is None or harness.harness_id != harness_id or harness.lease_id != lease_id:
            raise HarnessGone(
                f"slot {slot} runs no harness {harness_id!r}: the sandbox server restarted (a harness dies with it) "
                "or it was stopped"
            )
        return harness
