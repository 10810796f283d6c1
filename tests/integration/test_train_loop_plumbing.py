"""The closed training loop's plumbing, in two tiny steps: `bench/train_loop.py` starts the whole
stack, the run stores the model's own groups, the trainer takes them through the door's endpoint,
takes a GRPO step on each, has the server serve the result as the next version and acknowledges. Whether the reward rises is the
benchmark's question (30 steps, ~30 minutes); this checks that every part meets the next.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("matplotlib")

from tests.support import REPO  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_two_steps_of_the_train_loop_go_round(smollm2_gguf: Path, tmp_path: Path) -> None:
    plot = tmp_path / "reward.png"
    done = subprocess.run(
        [
            sys.executable,
            "bench/train_loop.py",
            "--steps",
            "2",
            "--group-size",
            "2",
            "--groups-per-step",
            "1",
            "--kills",
            "0",
            "--max-tokens",
            "24",
            "--allow-busy",
            "--plot",
            str(plot),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 2 and len(report["rewards"]) == 2
    assert all(0.0 <= reward <= 1.0 for reward in report["rewards"])
    # every group reached the trainer with the versions of its tokens, within the staleness bound
    assert report["groups_acknowledged"] == 2 and report["goals"]["nothing_lost"], report
    assert report["goals"]["staleness_within_bound"] and report["batches_acknowledged"] == 2
    assert sum(report["staleness_at_consumption"].values()) == 2
    assert all(0 <= int(lag) <= report["max_staleness"] for lag in report["staleness_at_consumption"])
    assert report["tokens_acknowledged"] + report["tokens_held_back_stale"] == report["tokens_generated"] > 0
    # where the trainer saw tokens of the weights it trains, it computed their logprobs as the server did
    if report["same_version_tokens"]:
        assert report["same_version_gap_mean"] <= 1e-3, report
    assert 0.0 < report["server_busy_fraction"] <= 1.0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
