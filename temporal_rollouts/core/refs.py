"""References to what lives in the object store, as workflows carry them: about a hundred bytes each.

The stores that write and read the content are in `temporal_rollouts.storage`.
"""

from __future__ import annotations

from pydantic import BaseModel, Field


class TranscriptRef(BaseModel):
    """A transcript as workflows carry it: the head node plus counts, about a hundred bytes."""

    head: str
    messages: int = Field(description="How many messages the transcript holds.")
    tokens: int = Field(description="Estimated context tokens (core.messages.estimate_tokens).")


class TokenTraceRef(BaseModel):
    """A token trace as workflows carry it."""

    head: str
    tokens: int = Field(description="Length of the sequence.")
    generated: int = Field(description="How many of its tokens the model generated.")
    messages: int = Field(description="How many transcript messages the sequence renders, the last reply included.")
    restarts: int = Field(
        default=0, description="Times the sequence began again from a fresh render (template drift or context fitting)."
    )
