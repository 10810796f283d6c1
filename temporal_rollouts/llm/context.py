"""Context size: fitting a long conversation into a turn's budget (the estimate is core.messages.estimate_tokens).

`fit_context` works on a copy, per turn: the saved transcript stays whole, only what one
model request sees is shortened. It first shortens old tool results, then drops the
oldest middle turns together with their tool replies, always keeping the opening
(system + task) and the latest exchanges, as the system we replace did.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from temporal_rollouts.core.errors import ContextOverflow
from temporal_rollouts.core.messages import Message, estimate_tokens

KEEP_HEAD = 2
"""Messages always kept at the start: the system prompt and the task."""
KEEP_TAIL = 6
"""Messages always kept at the end: the latest exchanges the model is working on."""
SHORTEN_OVER_CHARS = 200
"""Old tool results longer than this are shortened ..."""
SHORT_HEAD_CHARS = 100
SHORT_TAIL_CHARS = 50
"""... to their first 100 and last 50 characters around a marker."""
TRUNCATION_MARKER = "\n...[truncated]...\n"

TokenCounter = Callable[[Sequence[Message]], int]


def fit_context(messages: Sequence[Message], budget: int, count: TokenCounter = estimate_tokens) -> list[Message]:
    """A copy of `messages` that `count` puts at or under `budget` tokens.

    Raises ContextOverflow when even the kept head and tail do not fit: the rollout
    then stops with the `context_budget` reason instead of sending a prompt the
    model server would reject.
    """
    fitted = list(messages)
    if count(fitted) <= budget:
        return fitted
    middle = range(KEEP_HEAD, max(KEEP_HEAD, len(fitted) - KEEP_TAIL))
    for index in middle:
        fitted[index] = _shortened(fitted[index])
    if count(fitted) <= budget:
        return fitted
    while (turn := _oldest_middle_turn(fitted)) is not None:
        del fitted[turn]
        if count(fitted) <= budget:
            return fitted
    raise ContextOverflow(
        f"the conversation needs {count(fitted)} tokens after shortening and dropping old turns; the budget is {budget}"
    )


def _shortened(message: Message) -> Message:
    text = message.content or ""
    if message.role != "tool" or len(text) <= SHORTEN_OVER_CHARS:
        return message
    return message.model_copy(
        update={"content": text[:SHORT_HEAD_CHARS] + TRUNCATION_MARKER + text[-SHORT_TAIL_CHARS:]}
    )


def _oldest_middle_turn(messages: list[Message]) -> slice | None:
    """The oldest assistant message between head and tail with the tool replies that answer
    it, so no tool reply is left without the call it answers."""
    end = len(messages) - KEEP_TAIL
    for start in range(KEEP_HEAD, end):
        if messages[start].role != "assistant":
            continue
        stop = start + 1
        while stop < end and messages[stop].role == "tool":
            stop += 1
        if stop < len(messages) and messages[stop].role == "tool":
            continue  # its replies reach into the kept tail: dropping the call would orphan them
        return slice(start, stop)
    return None
