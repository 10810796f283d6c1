"""Prepare a slot's workspace for one item (the env's setup hook), and start the transcript."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from envs import get_env
from temporal_rollouts.core.errors import activity_boundary
from temporal_rollouts.core.harness import HarnessSpec, named_harness
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.core.steps import ensure_small, heartbeating
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotRef
from temporal_rollouts.storage.transcripts import TranscriptStore


class SetupWorkspaceInput(BaseModel):
    env: str
    env_config: dict[str, Any] = Field(default_factory=dict)
    item: Item
    lease: SlotRef
    rollout_key: str


class WorkspaceReady(BaseModel):
    transcript: TranscriptRef
    meta: dict[str, Any] = Field(default_factory=dict)
    harness: HarnessSpec | None = Field(default=None, description="The env's own harness, if it names one.")


class WorkspaceActivities:
    def __init__(self, pool: SandboxPool, transcripts: TranscriptStore) -> None:
        self._pool = pool
        self._transcripts = transcripts

    @activity.defn(name="setup_workspace")
    @checked_input
    async def setup_workspace(self, input: SetupWorkspaceInput) -> WorkspaceReady:
        with activity_boundary():
            env = get_env(input.env, input.env_config)
            slot = LeasedSlot(self._pool, input.lease, f"{input.rollout_key}/setup")
            meta = ensure_small(
                f"the {input.env} setup's metadata", await heartbeating(env.setup_workspace(input.item, slot))
            )
            transcript = await self._transcripts.start(env.prompt_messages(input.item), env.tool_specs())
            return WorkspaceReady(transcript=transcript, meta=meta, harness=named_harness(env.harness))
