"""One model turn: one request to the rollout's policy endpoint.

The endpoint (and its API key, read from the environment here) is resolved in the
worker from the policy *name*, so no URL secret or key ever enters a workflow history.
A chat policy gets the conversation fitted into the context budget; a token-level
policy (`sglang`/`vllm`) also extends the rollout's token trace, which travels by
reference like the transcript.
"""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel, Field
from temporalio import activity

from temporal_rollouts.core.errors import ConfigError, activity_boundary
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.records import Sampling
from temporal_rollouts.core.refs import TokenTraceRef, TranscriptRef
from temporal_rollouts.core.settings import ChatPolicy, GeneratePolicy, Settings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.llm.chat import ChatClient
from temporal_rollouts.llm.context import fit_context
from temporal_rollouts.llm.generate import GenerateClient
from temporal_rollouts.llm.templates import ChatTemplate
from temporal_rollouts.llm.token_client import TokenClient
from temporal_rollouts.sandbox.lease_keeper import lease_kept
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotRef
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import TranscriptStore

DEFAULT_CONTEXT_TOKENS = 32_768
REPLY_PREVIEW_CHARS = 120
"""The start of a reply shown in the Temporal UI; bounded so that history stays small."""
PREVIEW_TOOL_NAMES = 8


class LlmTurnInput(BaseModel):
    policy: str | None = None
    lease: SlotRef | None = Field(default=None, description="The rollout's slot, kept leased while the model thinks.")
    transcript: TranscriptRef
    sampling: Sampling | None = Field(default=None, description="None for the defaults (keeps history small).")
    context_tokens: int = Field(default=DEFAULT_CONTEXT_TOKENS, description="The turn's context budget.")
    tokens: TokenTraceRef | None = Field(default=None, description="The token trace so far (token-level policies).")
    restarts: int = Field(
        default=0,
        description="Restarts counted before a turn that begins a sequence (`tokens` None): a harness that "
        "rewrote its conversation.",
    )
    tool_call_parser: str | None = Field(default=None, description="Overrides the token-level policy's parser.")


class LlmTurnResult(BaseModel):
    transcript: TranscriptRef = Field(description="The transcript with the model's reply appended.")
    assistant: str = Field(description="Transcript key of the reply, where tool calls read their arguments.")
    calls: int = Field(default=0, description="How many tool calls the reply makes.")
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    tokens: TokenTraceRef | None = Field(
        default=None, description="The token trace with this turn (token-level policies)."
    )
    preview: str | None = Field(
        default=None, description="The first characters of the reply, for people reading the history."
    )
    tools_called: list[str] | None = Field(default=None, description="Names of the tools the reply calls (at most 8).")
    policy_version: int | None = Field(
        default=None,
        description="The weights that produced the reply, as the server reported them with it; None: unknown.",
    )


def reply_preview(reply: Message) -> str | None:
    """The first REPLY_PREVIEW_CHARS of the reply's text (its reasoning when it has no text), on one line."""
    text = " ".join((reply.content or reply.reasoning_content or "").split())
    if not text:
        return None
    return text if len(text) <= REPLY_PREVIEW_CHARS else text[: REPLY_PREVIEW_CHARS - 1] + "…"


class LlmActivities:
    def __init__(
        self, settings: Settings, transcripts: TranscriptStore, traces: TokenTraceStore, pool: SandboxPool | None = None
    ) -> None:
        self._settings = settings
        self._transcripts = transcripts
        self._traces = traces
        self._pool = pool
        self._chat_clients: dict[str, ChatClient] = {}
        self._token_clients: dict[str, TokenClient] = {}

    def _chat_client(self, endpoint: ChatPolicy) -> ChatClient:
        key = endpoint.model_dump_json()
        if key not in self._chat_clients:
            self._chat_clients[key] = ChatClient(
                base_url=endpoint.base_url,
                model=endpoint.model,
                api_key=api_key(endpoint),
                timeout_s=endpoint.timeout_s,
                max_connections=endpoint.max_connections,
            )
        return self._chat_clients[key]

    async def _token_client(self, endpoint: GeneratePolicy) -> TokenClient:
        key = endpoint.model_dump_json()
        if key not in self._token_clients:
            template = await asyncio.to_thread(ChatTemplate.load, endpoint.tokenizer, endpoint.chat_template)
            generator = GenerateClient(
                endpoint.base_url,
                endpoint.type,
                api_key(endpoint),
                endpoint.timeout_s,
                max_connections=endpoint.max_connections,
            )
            self._token_clients.setdefault(key, TokenClient(template, generator, endpoint.tool_call_parser))
        return self._token_clients[key]

    async def aclose(self) -> None:
        for client in [*self._chat_clients.values(), *self._token_clients.values()]:
            await client.aclose()
        self._chat_clients.clear()
        self._token_clients.clear()

    @activity.defn(name="llm_turn")
    @checked_input
    async def llm_turn(self, input: LlmTurnInput) -> LlmTurnResult:
        with activity_boundary():
            endpoint = self._settings.policy_endpoint(input.policy)
            if self._pool is None:
                return await heartbeating(self._generate(endpoint, input))
            async with lease_kept(self._pool, input.lease, self._settings.sandbox.lease_ttl_s):
                return await heartbeating(self._generate(endpoint, input))

    async def _generate(self, endpoint: ChatPolicy | GeneratePolicy, input: LlmTurnInput) -> LlmTurnResult:
        messages = await self._transcripts.load(input.transcript)
        tools = await self._transcripts.offered_tools(input.transcript)
        sampling = input.sampling or Sampling()
        if isinstance(endpoint, ChatPolicy):
            seen = fit_context(messages, input.context_tokens - (sampling.max_tokens or 0))
            reply = await self._chat_client(endpoint).complete(
                seen, tools, temperature=sampling.temperature, max_tokens=sampling.max_tokens
            )
            return await self._record(
                input,
                reply.message,
                finish_reason=reply.finish_reason,
                prompt_tokens=reply.usage.get("prompt_tokens"),
                completion_tokens=reply.usage.get("completion_tokens"),
                policy_version=numeric_version(reply.weight_version),
            )
        client = await self._token_client(endpoint)
        prefill = await self._prefill(endpoint, messages, tools)
        prior = await self._traces.load(input.tokens) if input.tokens else None
        turn = await client.turn(
            messages,
            tools,
            prior=prior,
            prior_messages=input.tokens.messages if input.tokens else 0,
            temperature=sampling.temperature,
            max_tokens=sampling.max_tokens,
            context_tokens=input.context_tokens,
            prefill=prefill,
            id_seed=input.transcript.head,
            tool_call_parser=input.tool_call_parser,
        )
        restarts = (input.tokens.restarts if input.tokens else input.restarts) + (1 if turn.restarted else 0)
        trace = await self._traces.append(
            None if turn.restarted else input.tokens, turn.added, messages=len(messages) + 1, restarts=restarts
        )
        return await self._record(
            input,
            turn.message,
            finish_reason=turn.finish_reason,
            prompt_tokens=turn.prompt_tokens,
            completion_tokens=turn.completion_tokens,
            tokens=trace,
            policy_version=numeric_version(turn.weight_version),
        )

    async def _prefill(self, endpoint: GeneratePolicy, messages: list[Message], tools) -> Message | None:
        if endpoint.prefill_from is None:
            return None
        steer = self._settings.policy_endpoint(endpoint.prefill_from)
        if not isinstance(steer, ChatPolicy):
            raise ConfigError(f"prefill_from must name a chat policy, not a {steer.type} one")
        return (await self._chat_client(steer).complete(messages, tools, temperature=0.0)).message

    async def _record(self, input: LlmTurnInput, reply: Message, **fields) -> LlmTurnResult:
        return LlmTurnResult(
            transcript=await self._transcripts.append(input.transcript, [reply]),
            assistant=await self._transcripts.put_message(reply),
            calls=len(reply.tool_calls or []),
            preview=reply_preview(reply),
            tools_called=[call.function.name[:64] for call in (reply.tool_calls or [])[:PREVIEW_TOOL_NAMES]] or None,
            **fields,
        )


FIRST_WEIGHTS = "default"
"""SGLang's (and our CPU server's) name for the weights a server started with, before any update."""


def numeric_version(reported: str | None) -> int | None:
    """A server's weight version as a number of trainer steps: our trainers publish the weights after step k
    as version "k", so the weights the server started with ("default") are version 0. None for no version
    or a name that is not a number: unknown, never a guess.

    A turn's label is only ever what the server said about the weights that produced it (under the same
    lock as the request). It once fell back to run-api's trainer step when the server said "default": a
    trainer that had taken batch 1 but not yet published its weights had turns of version 0 labelled 1, and
    the first step after the first update measured a logprob gap of 1e-2 on tokens it took for its own."""
    if reported == FIRST_WEIGHTS:
        return 0
    try:
        return int(reported) if reported is not None else None
    except ValueError:
        return None


def api_key(endpoint: ChatPolicy | GeneratePolicy) -> str | None:
    return os.environ.get(endpoint.api_key_env) if endpoint.api_key_env else None
