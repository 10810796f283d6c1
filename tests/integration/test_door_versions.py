"""Every token's version label is true, through the whole path: a door training run of `write_word` on
SmolLM2 (the real worker, sandbox and CPU policy server), a trainer that takes each batch through the
door's endpoint and client, recomputes the logprob of every trained token with the weights its turn's
label names, and publishes new weights while the next groups' requests (which share their prompt, so
the server answers them from its prompt cache) are in flight.

Before labels came only from the server, a turn served by the weights a server started with ("default")
was labelled with run-api's trainer step, which ran one ahead of the published weights: the first step
after the first update measured a gap of 1e-2 on tokens it took for its own. Here no turn is unlabelled,
and no recomputed logprob differs from the server's by more than 1e-4.
"""

from __future__ import annotations

import asyncio
import copy
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from temporal_rollouts.client.training import feed_status

torch = pytest.importorskip("torch")

from examples.grpo.trainer import ScoredSequence, token_logprobs  # noqa: E402
from temporal_rollouts.core.feed import FeedInput  # noqa: E402
from temporal_rollouts.core.records import RolloutLimits, Sampling  # noqa: E402
from temporal_rollouts.core.settings import GeneratePolicy, Settings  # noqa: E402
from temporal_rollouts.door.client import Batch, DoorClient  # noqa: E402
from temporal_rollouts.llm.templates import PACKAGED_TEMPLATES  # noqa: E402
from temporal_rollouts.policy_servers.weights import save_weights  # noqa: E402
from tests.support.servers.door import DoorProcess  # noqa: E402
from tests.support.servers.fixtures import GenerateServerProcess  # noqa: E402
from workflows.feed import TrainingFeedWorkflow  # noqa: E402

pytestmark = pytest.mark.slow

GROUP_SIZE = 2
STEPS = 2
TOLERANCE = 1e-4


@pytest.fixture
def policy(settings: Settings, own_smollm2_server: GenerateServerProcess) -> Iterator[str]:
    settings.policies["door-smol"] = GeneratePolicy(
        type="sglang",
        base_url=own_smollm2_server.url,
        tokenizer=str(own_smollm2_server.tokenizer_dir),
        chat_template=str(PACKAGED_TEMPLATES / "smollm2_tools.jinja"),
        tool_call_parser="hermes",
    )
    yield "door-smol"
    settings.policies.pop("door-smol", None)


@pytest.fixture
def door(settings: Settings, tmp_path: Path) -> Iterator[DoorProcess]:
    assert settings.temporal.address is not None
    process = DoorProcess(tmp_path / "door.log", settings.temporal.address, settings.data_dir)
    process.start()
    yield process
    process.stop()


def versions_of(smollm2_model, steps: int) -> dict[int, object]:
    """Version 0, the served model; version k, each weight moved by 1 % of its spread k times (fixed seeds)."""
    models = {0: smollm2_model}
    for version in range(1, steps + 1):
        model = copy.deepcopy(models[version - 1])
        generator = torch.Generator().manual_seed(version)
        with torch.no_grad():
            for param in model.parameters():
                param.add_(torch.randn(param.shape, generator=generator) * 0.01 * param.std())
        models[version] = model
    return models


def largest_gap(batch: Batch, models: dict[int, object]) -> tuple[float, int]:
    """The largest |trainer logprob - server logprob| over the batch's trained tokens, each recomputed by the
    weights its turn's label names, and how many tokens were checked."""
    worst, checked = 0.0, 0
    for sequence in batch.sequences():
        assert sequence.versions and None not in sequence.versions, f"an unlabelled turn: {sequence.rollout_id}"
        assert len(set(sequence.versions)) == 1, "one turn per write_word rollout"
        trainable = [i for i in sequence.trainable() if i > 0]
        if not trainable:
            continue
        scored = ScoredSequence(sequence.tokens, trainable, [sequence.logprobs[i] for i in trainable], 0.0)
        with torch.no_grad():
            mine = token_logprobs(models[sequence.versions[0]], [scored])[0]
        gaps = (mine - torch.tensor(scored.inference_logprobs)).abs()
        worst, checked = max(worst, float(gaps.max())), checked + len(trainable)
    return worst, checked


TAKE_WITHIN_S = 240.0
"""A batch of two groups of one-turn rollouts takes seconds; four minutes without one is a hang."""


@pytest.mark.timeout(900)
@pytest.mark.xfail(
    reason="hung once in a clean-clone CI run beside three other test workers: after the weights of step 2 were "
    "loaded, no take returned a batch for 9 minutes (the run's last batch never filled?); passed in the run before "
    "and on its branch. Open in issue 43's note until the cause is found.",
    strict=False,
)
async def test_every_trained_token_is_labelled_with_the_weights_that_made_it(
    client, settings: Settings, policy: str, door: DoorProcess, own_smollm2_server, smollm2_model, tmp_path: Path
) -> None:
    models = versions_of(smollm2_model, STEPS)
    for version in range(1, STEPS + 1):
        models[version].eval()
    run = f"door-versions-{uuid.uuid4().hex[:6]}"
    handle = await client.start_workflow(
        TrainingFeedWorkflow.run,
        FeedInput(
            env="write_word",
            policy=policy,
            group_size=GROUP_SIZE,
            batch_size=2 * GROUP_SIZE,
            max_staleness=1,
            max_groups=2 * (STEPS + 1),
            sampling=Sampling(temperature=1.0, max_tokens=12),
            limits=RolloutLimits(max_turns=1),
        ),
        id=run,
        task_queue=settings.temporal.task_queue,
    )
    trainer = DoorClient(door.url)
    seen_versions: set[int] = set()
    for step in range(STEPS + 1):
        batch, deadline = None, time.monotonic() + TAKE_WITHIN_S
        while batch is None:
            batch = await asyncio.to_thread(trainer.take, run, lease_s=300, trainer_version=step)
            if batch is None and time.monotonic() > deadline:  # say where the run stands, not only that it hung
                status = await feed_status(client, run)
                pytest.fail(f"step {step}: no batch in {TAKE_WITHIN_S:.0f}s; the run: {status.model_dump_json()}")
            await asyncio.sleep(0 if batch else 0.5)
        gap, checked = largest_gap(batch, models)
        assert checked > 0 and gap <= TOLERANCE, f"step {step}: gap {gap:.1e} over {checked} tokens"
        seen_versions |= {v for s in batch.sequences() for v in s.versions}
        staleness = [g["group_overrides"]["staleness"] for g in batch.groups]
        assert all(0 <= s <= 1 for s in staleness), staleness
        if step < STEPS:  # publish the next weights while the next groups sample (max staleness 1)
            folder = await asyncio.to_thread(save_weights, models[step + 1], tmp_path / f"v{step + 1}")
            async with httpx.AsyncClient(timeout=600) as http:
                answer = await http.post(
                    f"{own_smollm2_server.url}/update_weights_from_disk",
                    json={"model_path": str(folder), "weight_version": str(step + 1)},
                )
            assert answer.json()["success"], answer.text
        assert await asyncio.to_thread(batch.ack) == "acknowledged"
    done = await handle.result()
    assert done.door.figures.batches_acknowledged == STEPS + 1 and done.figures.dropped == {}
    assert len(seen_versions) >= 2, f"groups of more than one version were checked: {seen_versions}"
    assert done.door.figures.completion_tokens_acknowledged == done.figures.tokens_generated
