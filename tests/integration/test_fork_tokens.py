"""Branches and forks of token-level rollouts share their prefix token for token, logprobs included.

SmolLM2-135M-Instruct behind the real CPU `/generate` server, steered by the demo policy as in
test_token_rollout.py. What a trainer relies on: a branch's sequence begins with its parent's
exact tokens and logprobs up to the branch point (they were not generated again: the server
never saw those turns twice), and with prefix_tokens=once the prefix is masked in the branch.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from temporalio.client import Client

from temporal_rollouts.client.forks import start_fork
from temporal_rollouts.core.records import BatchInput, RolloutLimits, Sampling, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.token_trace import IGNORE_INDEX
from temporal_rollouts.core.trees import RolloutTreeResult
from temporal_rollouts.sinks.jsonl import read_groups
from tests.support.servers.fixtures import GenerateServerProcess, generate_policy
from tests.support.waiting import batch_id
from temporal_rollouts.runtime.worker import Parts
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow


@pytest.fixture
def smol(settings: Settings, smollm2_server: GenerateServerProcess) -> Iterator[str]:
    settings.policies["smol"] = generate_policy(smollm2_server)
    yield "smol"
    settings.policies.pop("smol", None)


def served(server: GenerateServerProcess) -> int:
    return len(httpx.get(f"{server.url}/requests", timeout=10).raise_for_status().json())


@pytest.mark.timeout(600)
async def test_a_branch_and_a_fork_carry_their_parents_tokens_and_logprobs_exactly(
    client: Client,
    settings: Settings,
    parts: Parts,
    smol: str,
    smollm2_server: GenerateServerProcess,
) -> None:
    httpx.post(f"{smollm2_server.url}/requests/reset", timeout=10).raise_for_status()
    batch = BatchInput(
        env="echo_chain",
        env_config={"steps": 2},
        num_items=1,
        group_size=1,
        policy=smol,
        sampling=Sampling(temperature=1.0, max_tokens=8),
        limits=RolloutLimits(max_turns=4),
        branch={"at_turns": [1], "factor": 2},
    )
    result = await client.execute_workflow(
        BatchWorkflow.run, batch, id=batch_id("tokens-branch"), task_queue=settings.temporal.task_queue
    )
    assert result.completed == 2, result
    (group,) = read_groups(Path(result.output))
    parent_id, branch_id = group["metadata"]["rollout_ids"]
    parent = TrajectoryResult.model_validate(await client.get_workflow_handle(parent_id).result())
    branch = TrajectoryResult.model_validate(await client.get_workflow_handle(branch_id).result())
    assert branch.fork and branch.fork.parent == parent_id and parent.tokens and branch.tokens
    shared = branch.fork.prefix_tokens
    assert 0 < shared < min(len(group["tokens"][0]), len(group["tokens"][1]))
    assert group["tokens"][1][:shared] == group["tokens"][0][:shared]
    assert group["inference_logprobs"][1][:shared] == group["inference_logprobs"][0][:shared], "not generated again"
    assert group["masks"][1][:shared] == [IGNORE_INDEX] * shared, "prefix_tokens=once: trained in the parent only"
    assert any(m != IGNORE_INDEX for m in group["masks"][0][:shared])
    assert served(smollm2_server) == parent.turns + branch.turns - 1, "the branch's first turn was its parent's"

    handle, point, _ = await start_fork(client, settings, parent_id, 1, 1)
    (fork,) = RolloutTreeResult.model_validate(await handle.result()).results
    assert point.prefix.tokens is not None and fork.tokens is not None
    parent_trace, fork_trace = await parts.traces.load(parent.tokens), await parts.traces.load(fork.tokens)
    cut = point.prefix.tokens.tokens
    assert (
        fork_trace.tokens[:cut] == parent_trace.tokens[:cut]
        and fork_trace.logprobs[:cut] == parent_trace.logprobs[:cut]
    )
