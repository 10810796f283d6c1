"""One model turn: one chat request to the rollout's policy endpoint.

The endpoint (and its API key, read from the environment here) is resolved in the
worker from the policy *name*, so no URL secret or key ever enters a workflow history.
"""

from __future__ import annotations

import os

from pydantic import BaseModel, Field
from temporalio import activity

from activities.heartbeat import heartbeating
from activities.lease_keeper import lease_kept
from llm.chat import ChatClient
from rollouts.errors import activity_boundary
from rollouts.records import Sampling
from rollouts.settings import PolicyEndpoint, Settings
from sandboxes.pool import SandboxPool
from sandboxes.schema import SlotRef
from storage.transcripts import TranscriptRef, TranscriptStore


class LlmTurnInput(BaseModel):
    policy: str | None = None
    lease: SlotRef | None = Field(default=None, description="The rollout's slot, kept leased while the model thinks.")
    transcript: TranscriptRef
    sampling: Sampling | None = Field(default=None, description="None for the defaults (keeps history small).")


class LlmTurnResult(BaseModel):
    transcript: TranscriptRef = Field(description="The transcript with the model's reply appended.")
    assistant: str = Field(description="Transcript key of the reply, where tool calls read their arguments.")
    calls: int = Field(default=0, description="How many tool calls the reply makes.")
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class LlmActivities:
    def __init__(self, settings: Settings, transcripts: TranscriptStore, pool: SandboxPool | None = None) -> None:
        self._settings = settings
        self._transcripts = transcripts
        self._pool = pool
        self._clients: dict[str, ChatClient] = {}

    def _client(self, endpoint: PolicyEndpoint) -> ChatClient:
        key = endpoint.model_dump_json()
        if key not in self._clients:
            api_key = os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
            self._clients[key] = ChatClient(
                base_url=endpoint.base_url, model=endpoint.model, api_key=api_key, timeout_s=endpoint.timeout_s
            )
        return self._clients[key]

    async def aclose(self) -> None:
        for client in self._clients.values():
            await client.aclose()
        self._clients.clear()

    @activity.defn(name="llm_turn")
    async def llm_turn(self, input: LlmTurnInput) -> LlmTurnResult:
        with activity_boundary():
            client = self._client(self._settings.policy_endpoint(input.policy))
            messages = await self._transcripts.load(input.transcript)
            tools = await self._transcripts.offered_tools(input.transcript)
            sampling = input.sampling or Sampling()
            request = client.complete(messages, tools, temperature=sampling.temperature, max_tokens=sampling.max_tokens)
            if self._pool is None:
                reply = await heartbeating(request)
            else:
                async with lease_kept(self._pool, input.lease, self._settings.sandbox.lease_ttl_s):
                    reply = await heartbeating(request)
            transcript = await self._transcripts.append(input.transcript, [reply.message])
            return LlmTurnResult(
                transcript=transcript,
                assistant=await self._transcripts.put_message(reply.message),
                calls=len(reply.message.tool_calls or []),
                finish_reason=reply.finish_reason,
                prompt_tokens=reply.usage.get("prompt_tokens"),
                completion_tokens=reply.usage.get("completion_tokens"),
            )
