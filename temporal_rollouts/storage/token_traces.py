"""Token traces stored by reference, one segment per model turn.

A turn appends a segment (the tokens added since the last turn: tool results, the
generation prompt, the model's reply) that names its parent, so a 100-turn rollout
writes each token once, and its workflow history carries only `TokenTraceRef`s. A
fork's prefix is an earlier segment of the same chain (`cut`): siblings share it exactly.
"""

from __future__ import annotations

from pydantic import BaseModel
from temporalio.contrib.aws.s3driver import S3StorageDriverClient

from temporal_rollouts.core.refs import TokenTraceRef
from temporal_rollouts.core.token_trace import TokenTrace
from temporal_rollouts.storage.content import DEFAULT_CACHE_BYTES, ContentStore

PREFIX = "token-traces"


class _Segment(BaseModel):
    parent: str | None
    tokens: list[int]
    logprobs: list[float | None]


class TokenTraceStore:
    def __init__(self, objects: S3StorageDriverClient, bucket: str, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        self._store = ContentStore(objects, bucket, PREFIX, cache_bytes)

    async def append(
        self, parent: TokenTraceRef | None, added: TokenTrace, *, messages: int, restarts: int
    ) -> TokenTraceRef:
        """`parent` extended by `added`; None as parent starts a new sequence."""
        segment = _Segment(parent=parent.head if parent else None, tokens=added.tokens, logprobs=added.logprobs)
        head = await self._store.put("segments", segment.model_dump_json().encode(), segment)
        return TokenTraceRef(
            head=head,
            tokens=(parent.tokens if parent else 0) + len(added),
            generated=(parent.generated if parent else 0) + added.generated_count,
            messages=messages,
            restarts=restarts,
        )

    async def load(self, ref: TokenTraceRef) -> TokenTrace:
        trace = TokenTrace()
        for segment in await self._store.chain("segments", ref.head, _Segment.model_validate_json):
            trace.tokens.extend(segment.tokens)
            trace.logprobs.extend(segment.logprobs)
        return trace

    async def cut(self, ref: TokenTraceRef, turns: int, total_turns: int, messages: int) -> TokenTraceRef | None:
        """The trace as it stood after model turn `turns` of a rollout of `total_turns` (its head is the segment
        that turn appended; `messages`: the transcript's messages up to that turn's reply), or None when that
        segment is no longer on the chain: a later turn began the sequence again (ref.restarts)."""
        segments = await self._store.chain("segments", ref.head, _Segment.model_validate_json)
        first_turn = total_turns - len(segments) + 1
        if turns < first_turn or turns > total_turns:
            return None
        kept = segments[: turns - first_turn + 1]
        head = segments[len(kept)].parent if len(kept) < len(segments) else ref.head
        assert head is not None
        return TokenTraceRef(
            head=head,
            tokens=sum(len(s.tokens) for s in kept),
            generated=sum(1 for s in kept for logprob in s.logprobs if logprob is not None),
            messages=messages,
            restarts=ref.restarts,
        )
