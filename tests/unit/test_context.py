"""Context fitting (temporal_rollouts.llm.context.fit_context): a per-turn copy shortened to the budget in
the original system's order, and a clear stop when even that cannot fit."""

from __future__ import annotations

import pytest

from temporal_rollouts.core.errors import ContextOverflow
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall
from temporal_rollouts.llm.context import KEEP_HEAD, KEEP_TAIL, TRUNCATION_MARKER, estimate_tokens, fit_context


def _conversation(turns: int, output_chars: int) -> list[Message]:
    messages = [Message(role="system", content="You are an agent."), Message(role="user", content="Fix the build.")]
    for turn in range(turns):
        call = ToolCall(id=f"call_{turn}", function=FunctionCall(name="terminal", arguments='{"command": "make"}'))
        messages.append(Message(role="assistant", content=f"step {turn}", tool_calls=[call]))
        messages.append(Message(role="tool", tool_call_id=f"call_{turn}", content=f"out{turn}:" + "x" * output_chars))
    return messages


def test_under_budget_is_returned_unchanged() -> None:
    messages = _conversation(3, 50)
    assert fit_context(messages, estimate_tokens(messages)) == messages


def test_old_tool_results_are_shortened_first_and_the_original_is_untouched() -> None:
    messages = _conversation(10, 2_000)
    before = [m.model_copy(deep=True) for m in messages]
    full = estimate_tokens(messages)
    fitted = fit_context(messages, full - 1_000)
    assert messages == before, "the saved transcript must stay whole"
    assert len(fitted) == len(messages), "shortening alone was enough: nothing dropped"
    middle, tail = fitted[KEEP_HEAD:-KEEP_TAIL], fitted[-KEEP_TAIL:]
    shortened = [m for m in middle if m.role == "tool"]
    assert shortened and all(TRUNCATION_MARKER in (m.content or "") for m in shortened)
    assert all(m.content.startswith("out") and m.content.endswith("x" * 50) for m in shortened)
    assert tail == messages[-KEEP_TAIL:], "the latest exchanges are kept verbatim"
    assert estimate_tokens(fitted) <= full - 1_000


def test_then_oldest_middle_turns_are_dropped_with_their_tool_replies() -> None:
    messages = _conversation(30, 2_000)
    budget = estimate_tokens(messages[:KEEP_HEAD] + messages[-KEEP_TAIL:]) + 300
    fitted = fit_context(messages, budget)
    assert estimate_tokens(fitted) <= budget
    assert fitted[:KEEP_HEAD] == messages[:KEEP_HEAD]
    assert fitted[-KEEP_TAIL:] == messages[-KEEP_TAIL:]
    assert len(fitted) < len(messages)
    answered = set()
    for message in fitted:
        if message.role == "assistant":
            answered |= {call.id for call in message.tool_calls or []}
        if message.role == "tool":
            assert message.tool_call_id in answered, "a tool reply must not outlive the call it answers"
    kept_steps = [m.content for m in fitted if m.role == "assistant"]
    assert kept_steps == sorted(kept_steps, key=lambda c: int(c.split()[1])) and "step 29" in kept_steps
    assert "step 0" not in kept_steps, "the oldest turns go first"


def test_a_budget_below_head_and_tail_is_a_context_overflow() -> None:
    messages = _conversation(30, 2_000)
    with pytest.raises(ContextOverflow, match="budget is 100"):
        fit_context(messages, 100)


def test_an_exact_counter_can_replace_the_estimate() -> None:
    messages = _conversation(12, 400)
    calls = []

    def count(candidate) -> int:
        calls.append(len(candidate))
        return sum(len(m.content or "") for m in candidate)

    fitted = fit_context(messages, 3_000, count)
    assert count(fitted) <= 3_000 and calls
