"""The steps of a rollout whose agent is a harness in the slot (workflows/harness_loop.py).

`start_harness` puts the harness's bundle into the slot's container (once) and starts it there;
a retried start finds it running. `next_harness_call` takes the harness's oldest unanswered
model request from the sandbox server, reads it (llm/harness_wire.py) and writes the
conversation it carries into the transcript store: appended to the rollout's transcript when it
extends the conversation so far, a new transcript when it rewrites it. The model turn itself is
today's `llm_turn`. `answer_harness_call` sends the turn's reply back, and `stop_harness` ends
the harness when a limit of the rollout is reached. The request stays held by the sandbox server
until it is answered, so a worker that dies in between costs the harness only time: the next
worker's take returns the same request, and the turn's recorded result is answered without
asking the model again.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import BaseModel, Field
from temporalio import activity

from envs import get_env
from temporal_rollouts.core.errors import activity_boundary
from temporal_rollouts.core.harness import HarnessExit, HarnessSpec
from temporal_rollouts.core.inputs import checked_input
from temporal_rollouts.core.refs import TranscriptRef
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.steps import heartbeating
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.llm.harness_wire import (
    BadHarnessRequest,
    HarnessRequest,
    completion,
    error_body,
    extends,
    parse_request,
)
from temporal_rollouts.sandbox.harness_bundle import HarnessBundles
from temporal_rollouts.sandbox.lease_keeper import lease_kept
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import HARNESS_WAIT_S, SlotRef
from temporal_rollouts.storage.transcripts import TranscriptStore

HARNESS_MODEL = "policy"
"""The model name a harness is told ($ROLLOUTS_MODEL); the rollout's policy answers whatever it asks for."""
POLL_S = 20.0
"""One wait of the sandbox server for the next request; the step heartbeats between them."""


class StartHarnessInput(BaseModel):
    lease: SlotRef
    harness_id: str
    spec: HarnessSpec
    env: str
    env_config: dict[str, Any] = Field(default_factory=dict)
    item: Item


class HarnessStarted(BaseModel):
    started: bool = Field(description="This step started it; False: it was running already (a retried start).")
    bundle: str | None = None


class NextHarnessCallInput(BaseModel):
    lease: SlotRef
    harness_id: str
    sequence: TranscriptRef | None = Field(
        default=None, description="The conversation so far: the last request and its reply (None before the first)."
    )
    wait_s: float = Field(gt=0, description="How long to wait for a request: what is left of the wall-clock budget.")


class HarnessCall(BaseModel):
    request_id: str
    transcript: TranscriptRef = Field(description="The conversation the request carries, to which the reply goes.")
    extends: bool = Field(description="It continues the conversation so far; False: a first or a rewritten one.")
    max_tokens: int | None = Field(default=None, description="The harness's own cap on the reply.")


class NextHarnessCall(BaseModel):
    call: HarnessCall | None = None
    exit: HarnessExit | None = Field(default=None, description="The harness ended, with nothing pending.")
    bad_requests: int = Field(default=0, description="Malformed requests answered with 400 while waiting.")


class AnswerHarnessInput(BaseModel):
    lease: SlotRef
    harness_id: str
    request_id: str
    assistant: str = Field(description="Transcript key of the reply.")
    finish_reason: str | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None


class StopHarnessInput(BaseModel):
    lease: SlotRef
    harness_id: str


class HarnessActivities:
    def __init__(self, settings: Settings, pool: SandboxPool, transcripts: TranscriptStore) -> None:
        self._settings = settings
        self._pool = pool
        self._transcripts = transcripts
        self._bundles = HarnessBundles(settings.data_dir / "harness-bundles")

    @activity.defn(name="start_harness")
    @checked_input
    async def start_harness(self, input: StartHarnessInput) -> HarnessStarted:
        with activity_boundary():
            return await heartbeating(self._start(input))

    async def _start(self, input: StartHarnessInput) -> HarnessStarted:
        lease = self._pool.lease(input.lease)
        bundle = None
        if input.spec.bundled:
            bundle, archive = await self._bundles.archive(input.spec)
            await lease.share(bundle, archive)
        task = get_env(input.env, input.env_config).format_prompt(input.item)
        state = await lease.start_harness(
            input.harness_id,
            command=input.spec.command,
            env=dict(input.spec.env),
            bundle=bundle,
            task=task,
            model=HARNESS_MODEL,
        )
        return HarnessStarted(started=state.started, bundle=bundle)

    @activity.defn(name="next_harness_call")
    @checked_input
    async def next_harness_call(self, input: NextHarnessCallInput) -> NextHarnessCall:
        with activity_boundary():
            async with lease_kept(self._pool, input.lease, self._settings.sandbox.lease_ttl_s):
                return await heartbeating(self._next(input))

    async def _next(self, input: NextHarnessCallInput) -> NextHarnessCall:
        lease = self._pool.lease(input.lease)
        deadline = time.monotonic() + input.wait_s
        bad = 0
        while (left := deadline - time.monotonic()) > 0:
            polled = await lease.next_harness_request(input.harness_id, min(left, POLL_S, HARNESS_WAIT_S))
            if polled.request is None:
                if polled.exit is not None:
                    return NextHarnessCall(exit=polled.exit, bad_requests=bad)
                continue
            try:
                request = parse_request(polled.request.body)
            except BadHarnessRequest as err:
                bad += 1
                await lease.answer_harness_request(
                    input.harness_id, polled.request.request_id, error_body(str(err), 400), status=400
                )
                continue
            call = await self._conversation(input.sequence, request, polled.request.request_id)
            return NextHarnessCall(call=call, bad_requests=bad)
        return NextHarnessCall(bad_requests=bad)

    async def _conversation(
        self, sequence: TranscriptRef | None, request: HarnessRequest, request_id: str
    ) -> HarnessCall:
        """The request's conversation in the transcript store: the new messages appended to the sequence so far
        when it extends it with the same tools, else a transcript of its own."""
        if sequence is not None:
            so_far = await self._transcripts.load(sequence)
            tools = await self._transcripts.offered_tools(sequence)
            if tools == request.tools and extends(so_far, request.messages):
                transcript = await self._transcripts.append(sequence, request.messages[len(so_far) :])
                return HarnessCall(
                    request_id=request_id, transcript=transcript, extends=True, max_tokens=request.max_tokens
                )
        transcript = await self._transcripts.start(request.messages, request.tools)
        return HarnessCall(request_id=request_id, transcript=transcript, extends=False, max_tokens=request.max_tokens)

    @activity.defn(name="answer_harness_call")
    @checked_input
    async def answer_harness_call(self, input: AnswerHarnessInput) -> bool:
        """Whether the harness got the answer (False: answered before, or it had gone)."""
        with activity_boundary():
            reply = await self._transcripts.message(input.assistant)
            body = completion(
                reply,
                request_id=input.request_id,
                model=HARNESS_MODEL,
                finish_reason=input.finish_reason,
                prompt_tokens=input.prompt_tokens,
                completion_tokens=input.completion_tokens,
            )
            answered = await self._pool.lease(input.lease).answer_harness_request(
                input.harness_id, input.request_id, body
            )
            return answered.delivered

    @activity.defn(name="stop_harness")
    @checked_input
    async def stop_harness(self, input: StopHarnessInput) -> HarnessExit | None:
        with activity_boundary():
            state = await self._pool.lease(input.lease).stop_harness(input.harness_id)
            return state.exit
