"""Context fitting through a real rollout: a conversation over its budget goes on with a
fitted copy and keeps its saved transcript whole; a budget nothing fits in stops it."""

from __future__ import annotations

import uuid

from temporal_rollouts.core.messages import estimate_tokens
from temporal_rollouts.core.records import RolloutLimits, TrajectoryInput
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.llm.context import TRUNCATION_MARKER
from workflows.trajectory import TrajectoryWorkflow


async def test_a_rollout_over_its_context_budget_goes_on_with_a_fitted_copy(client, settings, transcripts) -> None:
    """Tool outputs of ~3,000 characters, six turns, a budget the whole conversation
    exceeds: each turn is sent a shortened copy, the rollout completes, and the saved
    transcript keeps every output whole."""
    result = await client.execute_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(
            env="echo_chain",
            item=Item(id="echo-0"),
            env_config={"steps": 6, "output_chars": 3_000},
            limits=RolloutLimits(context_tokens=4_000),
        ),
        id=f"context-fit-{uuid.uuid4().hex[:8]}",
        task_queue=settings.temporal.task_queue,
    )
    assert result.stop_reason.value == "completed" and result.score == 1.0
    saved = await transcripts.load(result.transcript)
    assert estimate_tokens(saved) > 4_000, "the conversation did outgrow the budget"
    assert all(TRUNCATION_MARKER not in (m.content or "") for m in saved), "the saved transcript stays whole"


async def test_a_budget_nothing_fits_in_stops_the_rollout_as_context_budget(client, settings) -> None:
    result = await client.execute_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="echo_chain", item=Item(id="echo-0"), limits=RolloutLimits(context_tokens=20)),
        id=f"context-stop-{uuid.uuid4().hex[:8]}",
        task_queue=settings.temporal.task_queue,
    )
    assert result.stop_reason.value == "context_budget" and result.turns == 0
    assert "budget is 20" in result.stop_detail
