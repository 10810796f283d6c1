"""`rollouts fork` and `rollouts show` as a user runs them, against the real worker, sandbox and demo policy."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid

import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from tests.support import REPO
from tests.support.processes import settings_environment
from tests.support.sandbox import needs_bubblewrap
from workflows.trajectory import TrajectoryWorkflow


async def rollouts(settings: Settings, *args: str) -> subprocess.CompletedProcess:
    """The `rollouts` command in a subprocess (in a thread: this test process runs the worker)."""
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "temporal_rollouts.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **settings_environment(settings)},
    )


def ending(printed: str) -> list[str]:
    """Workspace, stop reason and score of the one continuation `rollouts fork --wait` printed."""
    return printed.strip().splitlines()[-1].split()[1:4]


async def rollout(client: Client, settings: Settings, input: TrajectoryInput) -> TrajectoryResult:
    return TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            input,
            id=f"cli-source-{uuid.uuid4().hex[:6]}",
            task_queue=settings.temporal.task_queue,
        )
    )


async def test_rollouts_fork_starts_continuations_and_show_draws_the_tree(client: Client, settings: Settings) -> None:
    source = await rollout(
        client, settings, TrajectoryInput(env="echo_chain", item=Item(id="echo-31"), env_config={"steps": 4})
    )
    done = await rollouts(settings, "fork", source.rollout_id, "--at-turn", "2", "-n", "2", "--wait", "--json")
    assert done.returncode == 0, done.stderr
    forked = json.loads(done.stdout)
    assert forked["reused"]["turns"] == 2 and forked["rebuild"] == "replay" and forked["not_carried"] == []
    assert [r["score"] for r in forked["results"]] == [1.0, 1.0]
    root = forked["first"]
    assert forked["rollouts"] == [root, f"{root}/t2b1"]  # every continuation's id, not only the first

    shown = json.loads((await rollouts(settings, "show", source.rollout_id, "--json")).stdout)
    assert [(b["rollout_id"], b["at_turn"]) for b in shown["branches"]] == [(root, 2)]
    text = (await rollouts(settings, "show", root)).stdout
    assert f"forked  from {source.rollout_id} after turn 2 (workspace: replay, 2 tool call(s) replayed)" in text
    assert f"branches after turn 2: {root}/t2b1 (completed)" in text

    refused = await rollouts(settings, "fork", source.rollout_id, "--at-turn", "9")
    assert refused.returncode == 1 and "fork at a turn from 0 to 5" in refused.stderr

    listed = await rollouts(settings, "list", forked["fork_id"], "--json")  # a fork's id lists its rollouts
    assert listed.returncode == 0, listed.stderr
    assert [(r["rollout_id"], r["forked_from"]) for r in json.loads(listed.stdout)] == [
        (root, source.rollout_id),
        (f"{root}/t2b1", root),
    ]
    started = await rollouts(settings, "fork", source.rollout_id, "--at-turn", "1", "-n", "3", "--wait")
    assert started.returncode == 0, started.stderr
    lines = started.stdout.splitlines()
    tree = next(line.split()[1].rstrip(":") for line in lines if line.startswith("started "))
    named = [line.strip() for line in lines if line.startswith(f"  {tree}/")]
    assert named == [f"{tree}/n0", f"{tree}/n0/t1b1", f"{tree}/n0/t1b2"], started.stdout
    again = await rollouts(settings, "fork", source.rollout_id, "--at-turn", "1", "--id", forked["fork_id"])
    assert again.returncode == 1 and "is taken by a RolloutTreeWorkflow" in again.stderr, again.stderr


@pytest.mark.slow
@needs_bubblewrap
async def test_a_fork_says_it_cannot_carry_the_stateful_terminal_and_a_replay_starts_it_again(
    client: Client,
    settings: Settings,
) -> None:
    """serve-status-page starts an HTTP server in the stateful terminal at turn 2: a fork from the
    snapshot of turn 2 has the files but no server (and fails its check), a replay starts it again."""
    source = await rollout(
        client, settings, TrajectoryInput(env="terminal_tasks", item=Item(id="serve-status-page"), snapshot_turns=True)
    )
    assert source.score == 1.0

    restored = await rollouts(settings, "fork", source.rollout_id, "--at-turn", "2", "--wait")
    carried = next(line for line in restored.stdout.splitlines() if line.startswith("  not carried "))
    assert carried.split(None, 2)[2].startswith("the stateful terminal's session"), restored.stdout
    assert "restored from the snapshot taken after turn 2" in restored.stdout
    assert restored.returncode == 0 and ending(restored.stdout) == ["snapshot", "completed", "0"], restored.stdout

    replayed = await rollouts(settings, "fork", source.rollout_id, "--at-turn", "2", "--rebuild", "replay", "--wait")
    assert "replayed in a new session" in replayed.stdout
    assert ending(replayed.stdout) == ["replay", "completed", "1"], replayed.stdout
