"""Scored groups: one item's rollouts in the shape of atroposlib's `ScoredDataGroup`.

Built in activities (never in workflow code) from the rollouts' results and what their
references point at: the transcripts and, for token-level policies, the token traces
with masks and the model's own logprobs. The JSONL sink, the `run-api` sink and the
Atropos env all send exactly this. A group that is a tree of rollouts also carries the
tree (sinks/trees.py).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from pydantic import BaseModel, Field

from temporal_rollouts.core.messages import Message
from temporal_rollouts.core.forks import PrefixTokens
from temporal_rollouts.core.records import ToolStats, TrajectoryResult
from temporal_rollouts.llm.sft import sft_tokens
from temporal_rollouts.llm.templates import ChatTemplate
from temporal_rollouts.sinks.trees import is_tree, mask_prefix, masked_prefix, rollout_tree_fields, tree_summary
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import TranscriptStore

TOOL_ERRORS_KEPT = 50
"""Tool errors listed in a group's metadata; the count covers all of them."""


class ScoredGroup(BaseModel):
    """The fields of atroposlib's `ScoredDataGroup`, plus our own `metadata`."""

    tokens: list[list[int]] = Field(default_factory=list)
    masks: list[list[int]] = Field(default_factory=list)
    scores: list[float]
    advantages: list[list[float]] | None = None
    ref_logprobs: list[list[float]] | None = None
    messages: list[list[dict[str, Any]]] | None = None
    generation_params: dict[str, Any] | None = None
    inference_logprobs: list[list[float]] | None = None
    group_overrides: dict[str, Any] | None = None
    overrides: list[dict[str, Any]] | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    def for_api(self) -> dict[str, Any]:
        """The body of run-api's `/scored_data`: its fields only (it ignores the rest)."""
        return self.model_dump(exclude={"metadata"})


def tool_error_stats(results: list[TrajectoryResult]) -> dict[str, Any]:
    """How many tool errors the group made, by tool, and the first few in full."""
    errors = [e for r in results for e in r.tool_errors]
    return {
        "count": len(errors),
        "by_tool": dict(Counter(e.tool_name for e in errors)),
        "errors": [e.model_dump() for e in errors[:TOOL_ERRORS_KEPT]],
    }


class GroupBuilder:
    def __init__(self, transcripts: TranscriptStore, traces: TokenTraceStore) -> None:
        self._transcripts = transcripts
        self._traces = traces

    async def build(
        self,
        group_id: str,
        results: list[TrajectoryResult],
        *,
        max_token_length: int = 0,
        sft_template: ChatTemplate | None = None,
        prefix_tokens: PrefixTokens | None = None,
    ) -> ScoredGroup:
        """`max_token_length` > 0 cuts each token sequence from the end to that length: a
        long rollout still trains on its start instead of its whole group being dropped.
        `sft_template` renders rollouts without a token trace (a chat policy's) into token
        ids and masks for SFT (llm/sft.py); without it they carry empty lists. `prefix_tokens`: how a tree's
        shared prefixes are trained (sinks/trees.py)."""
        conversations = [await self._transcripts.load(r.transcript) if r.transcript else [] for r in results]
        messages = [[_for_trainer(m) for m in conversation] for conversation in conversations]
        tokens, masks, logprobs = [], [], []
        masked = masked_prefix(results, prefix_tokens)
        for result, conversation, hidden in zip(results, conversations, masked):
            trace = await self._traces.load(result.tokens) if result.tokens else None
            if trace is not None and max_token_length > 0:
                trace = trace.cut(max_token_length)
            if trace is None and sft_template is not None and conversation:
                tools = await self._transcripts.offered_tools(result.transcript)
                ids, id_masks = await asyncio.to_thread(sft_tokens, sft_template, conversation, tools)
                if max_token_length > 0:
                    ids, id_masks = ids[:max_token_length], id_masks[:max_token_length]
                tokens.append(ids)
                masks.append(id_masks)
                logprobs.append(None)
                continue
            tokens.append(trace.tokens if trace else [])
            masks.append(mask_prefix(trace.masks(), hidden) if trace else [])
            logprobs.append(trace.inference_logprobs() if trace else None)
        stats = tool_error_stats(results)
        calls = ToolStats.total([r.tool_stats for r in results])
        tree = is_tree(results)
        overrides = [
            {
                "rollout_id": r.rollout_id,
                "stop_reason": r.stop_reason.value,
                **(rollout_tree_fields(r, hidden if r.tokens else 0) if tree else {}),
            }
            for r, hidden in zip(results, masked)
        ]
        group_overrides = {
            "tool_errors": stats["count"],
            "tool_errors_by_tool": stats["by_tool"],
            "tool_stats": calls.model_dump(),
        }
        if tree:
            group_overrides["tree"] = tree_summary(results, prefix_tokens)
        return ScoredGroup(
            tokens=tokens,
            masks=masks,
            scores=[r.score for r in results],
            messages=messages,
            inference_logprobs=logprobs if all(lp is not None for lp in logprobs) else None,
            overrides=overrides,
            # travels with the group through run-api (which keeps only ScoredDataGroup fields)
            group_overrides=group_overrides,
            metadata={
                "group_id": group_id,
                "env": results[0].env,
                "item_id": results[0].item_id,
                "rollout_ids": [r.rollout_id for r in results],
                "stop_reasons": [r.stop_reason.value for r in results],
                "resumed_rollouts": [r.rollout_id for r in results if r.resumed_from_run],
                "token_restarts": [r.tokens.restarts if r.tokens else None for r in results],
                "tool_errors": stats,
                "tool_stats": {
                    "total": calls.model_dump(),
                    "per_rollout": [r.tool_stats.model_dump() for r in results],
                },
            },
        )


def _for_trainer(message: Message) -> dict[str, Any]:
    """OpenAI shape with `content` always present: run-api rejects a message without it."""
    data = message.to_openai()
    data.setdefault("content", "")
    return data
