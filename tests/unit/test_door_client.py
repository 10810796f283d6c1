"""The trainer's side of the door, at the transport seam: a retried take keeps its request id, a batch
reads as sequences with their versions and marks, the end of a run ends the iteration; and the
endpoint refuses to listen beyond loopback without a key."""

from __future__ import annotations

import json

import httpx
import pytest

from temporal_rollouts.door import server
from temporal_rollouts.sandbox_server.http.keys import KeyRequired
from temporal_rollouts.door.client import DoorClient, DoorClientError, door_metrics

GROUP = {
    "tokens": [[5, 6, 7], [5, 6, 8]],
    "masks": [[-100, 6, 7], [-100, -100, 8]],
    "scores": [1.0, 0.0],
    "inference_logprobs": [[1.0, -0.1, -0.2], [1.0, 1.0, -0.3]],
    "overrides": [
        {"rollout_id": "r/g0/r0", "policy_versions": [3]},
        {"rollout_id": "r/g0/r1", "policy_versions": [2, 3], "parent": "r/g0/r0", "branch_turn": 1},
    ],
    "group_overrides": {"group_id": "r/g0", "staleness": 1, "stale": False},
}


def batch_answer(number: int = 0) -> dict:
    return {
        "batch": {
            "number": number,
            "lease": f"{number}.1",
            "deadline": 1e10,
            "deliveries": 1,
            "trainer_version": 3,
            "final": False,
            "groups": [GROUP],
        },
        "acknowledged_below": number,
        "next_number": number + 1,
    }


def test_a_take_whose_answer_was_lost_is_sent_again_under_the_same_request_id() -> None:
    seen: list[dict] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(json.loads(request.content))
        if len(seen) == 1:
            return httpx.Response(503, json={"error": {"message": "no worker answered", "code": 503}})
        return httpx.Response(200, json=batch_answer())

    door = DoorClient("http://door", transport=httpx.MockTransport(handler))
    door.retry_for_s = 5
    batch = door.take("r", lease_s=30, trainer_version=3)
    assert batch is not None and len(seen) == 2
    assert seen[0]["request_id"] == seen[1]["request_id"] and seen[0]["request_id"].startswith("take-")
    assert seen[0]["lease_s"] == 30 and seen[0]["trainer_version"] == 3
    first, second = batch.sequences()
    assert (first.versions, first.trainable(), first.score, first.group_id) == ([3], [1, 2], 1.0, "r/g0")
    assert (second.parent, second.branch_turn, second.trainable()) == ("r/g0/r0", 1, [2])
    assert batch.scores == [1.0, 0.0]


def test_batches_end_when_the_run_is_done_and_a_refusal_is_raised_with_its_words() -> None:
    answers = iter(
        [
            httpx.Response(200, json=batch_answer(0)),
            httpx.Response(200, json={"batch": None, "acknowledged_below": 1, "next_number": 1}),
            httpx.Response(200, json=batch_answer(1)),
            httpx.Response(410, json={"error": {"message": "training run r is done", "code": 410}}),
        ]
    )
    door = DoorClient("http://door", transport=httpx.MockTransport(lambda request: next(answers)))
    assert [b.number for b in door.batches("r", poll_s=0)] == [0, 1]

    refusing = DoorClient(
        "http://door",
        transport=httpx.MockTransport(
            lambda request: httpx.Response(409, json={"error": {"message": "lease '9.1' is not one of batch 0's"}})
        ),
    )
    with pytest.raises(DoorClientError, match="not one of batch 0's") as refused:
        refusing.ack("r", 0, "9.1")
    assert refused.value.status == 409


def test_the_door_figures_read_as_flat_metrics() -> None:
    door = {
        "trainer_version": 4,
        "batches_out": 1,
        "pending_groups": 2,
        "figures": {"batches_acknowledged": 4, "batches_redelivered": 1, "staleness": {"0": 5, "1": 3}},
    }
    metrics = door_metrics(door)
    assert metrics["door/batches_acknowledged"] == 4 and metrics["door/batches_redelivered"] == 1
    assert metrics["door/max_staleness_consumed"] == 1 and metrics["door/trainer_version"] == 4


@pytest.mark.parametrize("host", ["0.0.0.0", "10.0.0.5", "::", "gpu-node"])
def test_the_endpoint_refuses_to_listen_beyond_loopback_without_a_key(host: str) -> None:
    with pytest.raises(KeyRequired, match="--api-key-env"):
        server.main(["--host", host])


def test_rollouts_train_status_shows_what_the_trainer_took_acknowledged_and_was_handed_again() -> None:
    from temporal_rollouts.cli.train import format_feed
    from temporal_rollouts.core.door import DoorFigures
    from temporal_rollouts.client.training import RunReport
    from temporal_rollouts.core.feed import DoorStatus, FeedFigures, TrainerView

    door = DoorStatus(
        batch_size=16,
        trainer_version=2,
        pending_groups=1,
        batches_out=1,
        batches_to_redeliver=0,
        next_number=3,
        acknowledged_below=2,
        figures=DoorFigures(
            batches_formed=3, batches_taken=4, batches_acknowledged=2, batches_redelivered=1, staleness={"0": 3}
        ),
    )
    status = RunReport(
        outcome="running",
        run="r",
        env="write_word",
        phase="waiting for rollouts",
        in_flight=2,
        rollouts_running=4,
        figures=FeedFigures(groups_started=6, groups_posted=4),
        trainer=TrainerView(),
        max_staleness=1,
        admitted=False,
        stopping=False,
        door=door,
    )
    text = " ".join(format_feed(status, width=400).split())
    assert "4 stored for the door" in text and "run-api" not in text
    assert "batches 3 formed, 4 taken, 2 acknowledged, 1 re-delivered" in text
    assert "at consumption (versions: groups) 0: 3" in text and "waiting for the trainer to acknowledge" in text
