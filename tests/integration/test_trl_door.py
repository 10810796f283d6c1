"""A trainer the field uses, unpatched, trains from the door: `examples/trl_grpo/train.py` in two tiny
steps. It starts the whole stack (the CPU policy server, `python worker.py`, the door's endpoint and a
training run of write_word), TRL's GRPOTrainer takes each batch through the door's client as its
`rollout_func`, steps, publishes the weights as the next version and acknowledges. Whether the reward
rises is the example's own run (its README); this checks that TRL and the door meet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl")
pytest.importorskip("matplotlib")

from tests.support import REPO  # noqa: E402

pytestmark = pytest.mark.slow


@pytest.mark.timeout(900)
def test_trls_grpo_trainer_takes_two_steps_from_the_door(smollm2_gguf: Path, tmp_path: Path) -> None:
    out = tmp_path / "trl"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "examples.trl_grpo.train",
            "--steps",
            "2",
            "--group-size",
            "2",
            "--groups-per-step",
            "1",
            "--max-tokens",
            "16",
            "--threads",
            "1",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=840,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["steps"] == 2 and report["batches_acknowledged"] == 2, report
    assert all(0.0 <= reward <= 1.0 for reward in report["rewards"])
    assert set(report["staleness_at_consumption"]) == {"0"}, "max staleness 0: every token from the trained weights"
    curve = [json.loads(line) for line in (out / "curve.jsonl").read_text().splitlines()]
    assert [line["step"] for line in curve] == [1, 2] and [line["batch"] for line in curve] == [0, 1]
    assert (out / "reward.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (out / "checkpoints" / "step-00002").is_dir(), "TRL's weights, published as version 2"
