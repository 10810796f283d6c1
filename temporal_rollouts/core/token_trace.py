"""One rollout's token sequence as the model saw it, with what the model itself generated.

A trace is what a trainer needs: every token id in order, and for each one either the
model's own logprob (it generated that token) or None (prompt, tool results, forced
prefill, template glue between turns). Masks and Atropos' `inference_logprobs` are
derived from it, so the two can never disagree.
"""

from __future__ import annotations

from pydantic import BaseModel, Field, model_validator

IGNORE_INDEX = -100
"""The mask value of a token the trainer must not learn (prompt, tool output, ...)."""
NOT_GENERATED_LOGPROB = 1.0
"""Atropos' placeholder in `inference_logprobs` where the model generated nothing
(a real logprob is never positive, so the value cannot be mistaken for one)."""


class TokenTrace(BaseModel):
    tokens: list[int] = Field(default_factory=list)
    logprobs: list[float | None] = Field(
        default_factory=list, description="The model's logprob of each token it generated; None elsewhere."
    )

    @model_validator(mode="after")
    def _aligned(self) -> TokenTrace:
        if len(self.tokens) != len(self.logprobs):
            raise ValueError(f"{len(self.tokens)} tokens but {len(self.logprobs)} logprobs")
        return self

    def __len__(self) -> int:
        return len(self.tokens)

    def add_context(self, ids: list[int]) -> None:
        """Tokens the model read but did not write."""
        self.tokens.extend(ids)
        self.logprobs.extend([None] * len(ids))

    def add_generated(self, ids: list[int], logprobs: list[float]) -> None:
        if len(ids) != len(logprobs):
            raise ValueError(f"{len(ids)} generated tokens but {len(logprobs)} logprobs")
        self.tokens.extend(ids)
        self.logprobs.extend(logprobs)

    @property
    def generated_count(self) -> int:
        return sum(1 for logprob in self.logprobs if logprob is not None)

    def masks(self) -> list[int]:
        """The token id where the model generated it, IGNORE_INDEX everywhere else."""
        return [token if logprob is not None else IGNORE_INDEX for token, logprob in zip(self.tokens, self.logprobs)]

    def inference_logprobs(self) -> list[float]:
        return [NOT_GENERATED_LOGPROB if logprob is None else logprob for logprob in self.logprobs]

    def cut(self, max_tokens: int) -> TokenTrace:
        """The first `max_tokens` tokens: a sequence longer than the trainer takes is cut
        from the end, keeping the prompt and the earliest turns, not dropped whole."""
        return TokenTrace(tokens=self.tokens[:max_tokens], logprobs=self.logprobs[:max_tokens])
