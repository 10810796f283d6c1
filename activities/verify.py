"""Score a finished rollout with the env's verifier, run in the rollout's own slot."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from envs import get_env
from temporal_rollouts.core.errors import activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.core.steps import ensure_small, heartbeating
from temporal_rollouts.core.tasks import Item, Verdict
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotRef
from temporal_rollouts.storage.transcripts import TranscriptStore


class VerifyInput(BaseModel):
    env: str
    env_config: dict[str, Any] = Field(default_factory=dict)
    item: Item
    lease: SlotRef
    rollout_key: str
    transcript: TranscriptRef
    meta: dict[str, Any] = Field(default_factory=dict, description="What the env's workspace setup returned.")


class VerifyActivities:
    def __init__(self, pool: SandboxPool, transcripts: TranscriptStore) -> None:
        self._pool = pool
        self._transcripts = transcripts

    @activity.defn(name="verify")
    @checked_input
    async def verify(self, input: VerifyInput) -> Verdict:
        with activity_boundary():
            env = get_env(input.env, input.env_config)
            slot = LeasedSlot(self._pool, input.lease, f"{input.rollout_key}/verify", meta=input.meta)
            messages = await self._transcripts.load(input.transcript)
            verdict = await heartbeating(env.verify(input.item, slot, messages))
            ensure_small(f"the {input.env} verifier's details", verdict.details)
            return verdict
