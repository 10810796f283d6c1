"""swe_smith on the real sandbox: every shipped instance is a real task (its failing tests fail
at base_commit, everything passes with the reference patch), a demo batch through the real
worker scores 1.0, and the rewards of policies that do nothing or only look around are right."""

from __future__ import annotations

import asyncio
import json
import shlex
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
from temporalio.client import Client

from envs import get_env
from envs.swe_smith.config import SHIPPED_INSTANCES
from envs.swe_smith.env import SweSmithEnv
from envs.swe_smith.loader import read_instances
from temporal_rollouts.core.messages import FunctionCall, Message, ToolCall
from temporal_rollouts.core.records import BatchInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import SlotLease
from tests.support.sandbox import holder
from tests.support.waiting import batch_id, leased_slots
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

SHIPPED = read_instances(SHIPPED_INSTANCES)
CHUNKS_OF_200 = {"test_chunk_size": 200}
"""Grade in chunks of 200 test ids (the most allowed): the same results as chunks of 50, in fewer runs."""
VALIDATE_CONCURRENCY = 4


def slot_of(pool: SandboxPool, lease: SlotLease, name: str, meta: dict | None = None) -> LeasedSlot:
    """The slot handle for one hook, its call ids made unique: the sandbox answers a call id it has
    seen on this slot (even under an earlier lease) from its stored result."""
    return LeasedSlot(pool, lease, f"{uuid.uuid4().hex[:8]}/{name}", meta=meta)


@asynccontextmanager
async def leased(pool: SandboxPool, name: str) -> AsyncIterator[SlotLease]:
    lease = await pool.acquire(holder(name), ttl_s=1800, wait_s=600)
    try:
        yield lease
    finally:
        await pool.release(lease)


async def set_up(env: SweSmithEnv, pool: SandboxPool, lease: SlotLease, instance_id: str) -> dict:
    return await env.setup_workspace(Item(id=instance_id), slot_of(pool, lease, f"{instance_id}/setup"))


async def validate(env: SweSmithEnv, pool: SandboxPool, instance_id: str) -> list[str]:
    """What is wrong with one instance, by running it in a slot: empty when it is a real task."""
    instance = env.instance(Item(id=instance_id))
    problems = []
    async with leased(pool, "validate") as lease:
        meta = await set_up(env, pool, lease, instance_id)
        before = await env.verify(Item(id=instance_id), slot_of(pool, lease, f"{instance_id}/before", meta=meta), [])
        details = before.details
        still_passing = [t for t, outcome in details["fail_to_pass"].items() if outcome == "PASSED"]
        if before.score != 0.0 or still_passing or not details["installed"]:
            problems.append(f"at base_commit: score {before.score}, FAIL_TO_PASS passing {still_passing}")
        if details["pass_to_pass"]["not_passed"]:
            problems.append(f"PASS_TO_PASS failing at base_commit: {details['pass_to_pass']['not_passed'][:5]}")
        fix = slot_of(pool, lease, f"{instance_id}/fix")
        assert (await fix.write_file("patch", ".swe/fix.patch", instance.patch or "")).ok
        applied = await fix.exec("apply", f"cd {instance.checkout_name} && git apply ../.swe/fix.patch")
        if not applied.ok:
            problems.append(f"the reference patch does not apply: {applied.output[-300:]}")
        after = await env.verify(Item(id=instance_id), slot_of(pool, lease, f"{instance_id}/after", meta=meta), [])
        if after.score != 1.0:
            problems.append(f"with the reference patch: {json.dumps(after.details)[:1500]}")
    return problems


@pytest.mark.timeout(3600)
async def test_every_shipped_instance_fails_at_base_and_passes_with_its_patch(pool: SandboxPool) -> None:
    env = get_env("swe_smith", CHUNKS_OF_200)
    assert isinstance(env, SweSmithEnv)
    gate = asyncio.Semaphore(VALIDATE_CONCURRENCY)

    async def one(instance_id: str) -> tuple[str, list[str]]:
        async with gate:
            started = time.monotonic()
            problems = await validate(env, pool, instance_id)
            print(
                f"{instance_id}: {'ok' if not problems else problems} ({time.monotonic() - started:.0f}s)", flush=True
            )
            return instance_id, problems

    results = await asyncio.gather(*(one(instance_id) for instance_id in SHIPPED))
    broken = {instance_id: problems for instance_id, problems in results if problems}
    assert not broken, json.dumps(broken, indent=1)[:6000]
    assert await leased_slots(pool) == []
    projects = {instance.repo for instance in SHIPPED.values()}
    assert len(SHIPPED) >= 30 and len(projects) >= 3, (len(SHIPPED), projects)


def tool_turn(n: int, command: str) -> list[Message]:
    call = ToolCall(id=f"call-{n}", function=FunctionCall(name="terminal", arguments=json.dumps({"command": command})))
    return [Message(role="assistant", tool_calls=[call]), Message(role="tool", tool_call_id=f"call-{n}", content="...")]


async def test_rewards_for_doing_nothing_and_for_only_looking_around(pool: SandboxPool) -> None:
    instance_id = next(iter(SHIPPED))
    binary = get_env("swe_smith", CHUNKS_OF_200)
    shaped = get_env("swe_smith", {**CHUNKS_OF_200, "reward": "shaped"})
    item = Item(id=instance_id)
    prompt = binary.prompt_messages(item)
    name, failing = SHIPPED[instance_id].checkout_name, SHIPPED[instance_id].FAIL_TO_PASS[0]
    # Looking around as the system prompt says to: a venv with pytest from the wheels, then the failing test.
    looks = [
        f"cd {name} && git status --short && git log --oneline",
        "python3 -m venv --system-site-packages .venv && .venv/bin/pip install -q --no-index --find-links .swe/wheels pytest",
        f"cd {name} && ../.venv/bin/python -m pytest -q {shlex.quote(failing)}",
    ]
    async with leased(pool, "rewards") as lease:
        meta = await set_up(binary, pool, lease, instance_id)
        nothing = await binary.verify(item, slot_of(pool, lease, "nothing-binary", meta=meta), prompt)
        assert nothing.score == 0.0 and nothing.details["installed"] and not nothing.details["tests_passed"]
        assert set(nothing.details["fail_to_pass"].values()) - {"PASSED"}, "the failing tests ran and failed"
        assert (await shaped.verify(item, slot_of(pool, lease, "nothing-shaped", meta=meta), prompt)).score == 0.0

        looking = slot_of(pool, lease, "look")
        transcript = list(prompt)
        outputs = []
        for n, command in enumerate(looks):
            outputs.append(await looking.exec(f"look-{n}", command))
            transcript += tool_turn(n, command)
        assert outputs[0].ok and outputs[1].ok, [o.output[-500:] for o in outputs]
        assert outputs[2].exit_code == 1 and "1 failed" in outputs[2].output, outputs[2].output[-1000:]
        verdict = await shaped.verify(item, slot_of(pool, lease, "look-shaped", meta=meta), transcript)
        assert verdict.details["tool_calls"] == 3 and verdict.details["installed"]
        assert verdict.score == pytest.approx(0.4), "install succeeded, tests still fail: 0.4"
        assert (await binary.verify(item, slot_of(pool, lease, "look-binary", meta=meta), transcript)).score == 0.0


def uninstallable_repository(folder: Path) -> tuple[str, str]:
    """A git repository (not a bundle) whose setup.py fails, and its commit."""
    repo = folder / "uninstallable"
    (repo / "tests").mkdir(parents=True)
    (repo / "setup.py").write_text("raise SystemExit('this project cannot be built')\n")
    (repo / "tests" / "test_it.py").write_text("def test_it():\n    assert False\n")
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t"]
    for command in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "base"]):
        subprocess.run(git + command, check=True)
    commit = subprocess.run(git + ["rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    return "uninstallable", commit


async def test_a_failed_install_earns_only_the_calls(pool: SandboxPool, tmp_path: Path) -> None:
    """Shaped reward when `pip install -e .` fails: 0.05 a tool call (capped at 0.3), and the reason
    is in the details. The repository comes from a local folder of git repositories."""
    repo, commit = uninstallable_repository(tmp_path / "repos")
    row = {
        "instance_id": "u-1",
        "repo": repo,
        "base_commit": commit,
        "problem_statement": "make test_it pass",
        "FAIL_TO_PASS": ["tests/test_it.py::test_it"],
        "PASS_TO_PASS": [],
    }
    dataset = tmp_path / "set.jsonl"
    dataset.write_text(json.dumps(row) + "\n")
    env = get_env("swe_smith", {"dataset": str(dataset), "repo_base_url": str(tmp_path / "repos"), "reward": "shaped"})
    item = Item(id="u-1")
    transcript = env.prompt_messages(item)
    for n in range(3):
        transcript += tool_turn(n, "ls")
    async with leased(pool, "uninstallable") as lease:
        meta = await env.setup_workspace(item, slot_of(pool, lease, "setup"))
        verdict = await env.verify(item, slot_of(pool, lease, "verify", meta=meta), transcript)
    assert verdict.score == pytest.approx(0.15), verdict.details
    assert not verdict.details["installed"] and "cannot be built" in verdict.details["install_output"]
    assert verdict.details["fail_to_pass"] == {"tests/test_it.py::test_it": "NOT_RUN"}


async def test_demo_policy_batch_plays_the_reference_patch_and_scores_one(
    client: Client, settings: Settings, pool: SandboxPool
) -> None:
    batch = BatchInput(env="swe_smith", num_items=2, group_size=1, env_config=CHUNKS_OF_200)
    result = await client.execute_workflow(
        BatchWorkflow.run, batch, id=batch_id("swe"), task_queue=settings.temporal.task_queue
    )
    assert (result.total, result.completed, result.failed) == (2, 2, 0)
    assert result.mean_score == 1.0, result
    assert await leased_slots(pool) == []


async def test_a_model_that_does_nothing_scores_zero_through_the_worker(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    """The demo policy does not know these prompts (the problem statements are changed), so it answers
    without calling a tool: binary and shaped both give 0.0."""
    rows = [instance.model_dump(exclude_none=True) for instance in list(SHIPPED.values())[:1]]
    for row in rows:
        row["problem_statement"] = "Unknown to the demo policy: " + row["problem_statement"]
    dataset = tmp_path / "unknown.jsonl"
    dataset.write_text("".join(json.dumps(row) + "\n" for row in rows))
    for reward in ("binary", "shaped"):
        config = {**CHUNKS_OF_200, "dataset": str(dataset), "reward": reward}
        batch = BatchInput(env="swe_smith", num_items=1, group_size=1, env_config=config)
        result = await client.execute_workflow(
            BatchWorkflow.run, batch, id=batch_id("swe-idle"), task_queue=settings.temporal.task_queue
        )
        assert (result.completed, result.mean_score) == (1, 0.0), result
