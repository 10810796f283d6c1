"""Score a finished rollout with the env's verifier, run in the rollout's own slot."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.limits import ensure_small
from activities.slot_handle import LeasedSlot
from envs import get_env
from envs.base import Item, Verdict
from rollouts.errors import activity_boundary
from sandboxes.pool import SandboxPool
from sandboxes.schema import SlotRef
from storage.transcripts import TranscriptRef, TranscriptStore


class VerifyInput(BaseModel):
    env: str
    env_config: dict[str, Any] = Field(default_factory=dict)
    item: Item
    lease: SlotRef
    rollout_key: str
    transcript: TranscriptRef


class VerifyActivities:
    def __init__(self, pool: SandboxPool, transcripts: TranscriptStore) -> None:
        self._pool = pool
        self._transcripts = transcripts

    @activity.defn(name="verify")
    async def verify(self, input: VerifyInput) -> Verdict:
        with activity_boundary():
            env = get_env(input.env, input.env_config)
            slot = LeasedSlot(self._pool, input.lease, f"{input.rollout_key}/verify")
            messages = await self._transcripts.load(input.transcript)
            verdict = await heartbeating(env.verify(input.item, slot, messages))
            ensure_small(f"the {input.env} verifier's details", verdict.details)
            return verdict
