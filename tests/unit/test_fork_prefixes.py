"""A fork's prefix is an earlier head of its source's own chains, and a tree's group masks shared prefixes once.

The stores are the real ones over a local folder; no Temporal, no sandbox.
"""

from __future__ import annotations

import pytest

from temporal_rollouts.core.forks import BranchRecord, ForkOrigin
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall, ToolSpec
from temporal_rollouts.core.records import StopReason, TrajectoryResult
from temporal_rollouts.core.token_trace import IGNORE_INDEX, TokenTrace
from temporal_rollouts.sinks.groups import GroupBuilder
from temporal_rollouts.storage.objects import LocalObjectClient
from temporal_rollouts.storage.token_traces import TokenTraceStore
from temporal_rollouts.storage.transcripts import TranscriptStore

TOOLS = [ToolSpec(name="terminal", description="run", parameters={"type": "object", "properties": {}})]


def reply(*commands: str) -> Message:
    calls = [
        ToolCall(id=f"c{i}", function=FunctionCall(name="terminal", arguments=f'{{"command": "{c}"}}'))
        for i, c in enumerate(commands)
    ]
    return Message(role="assistant", content="", tool_calls=calls or None)


def result_of(call_id: str, text: str) -> Message:
    return Message(role="tool", tool_call_id=call_id, content=text)


@pytest.fixture
def stores(tmp_path) -> tuple[TranscriptStore, TokenTraceStore]:
    objects = LocalObjectClient(tmp_path)
    return TranscriptStore(objects, "rollouts"), TokenTraceStore(objects, "rollouts")


async def test_a_transcript_cut_at_turn_k_is_the_head_it_had_then(stores) -> None:
    transcripts, _ = stores
    example = Message(role="assistant", content="a worked example in the prompt, not a turn")
    start = await transcripts.start([Message(role="user", content="do it"), example], TOOLS)
    after_one = await transcripts.append(
        await transcripts.append(await transcripts.append(start, [reply("a", "b")]), [result_of("c0", "A")]),
        [result_of("c1", "B")],
    )
    after_two = await transcripts.append(await transcripts.append(after_one, [reply("c")]), [result_of("c0", "C")])
    final = await transcripts.append(after_two, [reply()])

    assert await transcripts.cut(final, 0) == start
    assert await transcripts.cut(final, 1) == after_one
    assert await transcripts.cut(final, 2) == after_two
    assert await transcripts.cut(final, 3) == final
    with pytest.raises(ValueError, match="3 model turns, not 4"):
        await transcripts.cut(final, 4)
    prompt, turns = await transcripts.recorded_turns(final)
    assert prompt[1] == example and [t.number for t in turns] == [1, 2, 3]
    assert [m.content for m in turns[0].results] == ["A", "B"] and turns[2].results == []


async def test_a_token_trace_cut_at_turn_k_is_its_segment_then_unless_a_later_turn_began_again(stores) -> None:
    _, traces = stores
    first = await traces.append(None, TokenTrace(tokens=[1, 2, 3], logprobs=[None, -0.1, -0.2]), messages=2, restarts=0)
    second = await traces.append(first, TokenTrace(tokens=[4, 5], logprobs=[None, -0.3]), messages=4, restarts=0)
    third = await traces.append(second, TokenTrace(tokens=[6], logprobs=[-0.4]), messages=6, restarts=0)

    assert await traces.cut(third, 2, 3, messages=4) == second
    assert await traces.cut(third, 1, 3, messages=2) == first
    assert await traces.cut(third, 3, 3, messages=6) == third
    restarted = await traces.append(
        None, TokenTrace(tokens=[9, 9, 9, 7], logprobs=[None, None, None, -0.5]), messages=8, restarts=1
    )
    assert await traces.cut(restarted, 3, 4, messages=6) is None, "turn 3's segment is no longer on the chain"
    assert await traces.cut(restarted, 4, 4, messages=8) == restarted


def rollout(rollout_id: str, tokens, transcript, fork: ForkOrigin | None = None, branches=()) -> TrajectoryResult:
    return TrajectoryResult(
        rollout_id=rollout_id,
        env="echo_chain",
        item_id="echo-1",
        score=1.0,
        stop_reason=StopReason.COMPLETED,
        transcript=transcript,
        tokens=tokens,
        fork=fork,
        branches=list(branches),
    )


@pytest.mark.parametrize("prefix_tokens", ["once", "every_branch"])
async def test_siblings_share_the_prefix_exactly_and_once_masks_it_in_the_branch(stores, prefix_tokens) -> None:
    transcripts, traces = stores
    transcript = await transcripts.start([Message(role="user", content="go")], TOOLS)
    shared = await traces.append(
        None, TokenTrace(tokens=[1, 2, 3, 4], logprobs=[None, None, -0.1, -0.2]), messages=2, restarts=0
    )
    parent_end = await traces.append(shared, TokenTrace(tokens=[5, 6], logprobs=[None, -0.3]), messages=4, restarts=0)
    branch_end = await traces.append(shared, TokenTrace(tokens=[5, 7], logprobs=[None, -0.6]), messages=4, restarts=0)
    parent = rollout("r/g0", parent_end, transcript, branches=[BranchRecord(turn=1, children=["r/g0/t1b1"])])
    branch = rollout(
        "r/g0/t1b1",
        branch_end,
        transcript,
        ForkOrigin(parent="r/g0", at_turn=1, prefix_tokens=shared.tokens, workspace="copy"),
    )

    group = await GroupBuilder(transcripts, traces).build("g", [parent, branch], prefix_tokens=prefix_tokens)

    assert group.tokens[0][:4] == group.tokens[1][:4] == [1, 2, 3, 4]
    assert group.masks[0] == [IGNORE_INDEX, IGNORE_INDEX, 3, 4, IGNORE_INDEX, 6]
    expected = [IGNORE_INDEX] * 4 if prefix_tokens == "once" else [IGNORE_INDEX, IGNORE_INDEX, 3, 4]
    assert group.masks[1] == expected + [IGNORE_INDEX, 7]
    assert group.overrides[1] == {
        "rollout_id": "r/g0/t1b1",
        "stop_reason": "completed",
        "parent": "r/g0",
        "branch_turn": 1,
        "prefix_tokens": 4,
        "prefix_masked": prefix_tokens == "once",
    }
    assert group.overrides[0]["parent"] is None
    assert group.group_overrides["tree"]["branch_points"] == [
        {"rollout_id": "r/g0", "turn": 1, "children": ["r/g0/t1b1"]}
    ]
