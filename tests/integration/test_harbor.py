"""Harbor tasks on real sandbox servers and item images: the verifier's own folders and its pristine root
(against an agent that forges the tools the tests use, plants a reward or links the reward file), and
the example tasks through the worker: 1.0 with the demo policy, 0 when the model does nothing."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from temporalio.client import Client

from envs.base import as_loaded
from envs.harbor.env import EXAMPLES, HarborEnv, _pack
from envs.terminal_tasks.loader import IMAGE_TASKS_DIR, TASKS_DIR
from temporal_rollouts.core.images import BuiltImage, ImageSpec
from temporal_rollouts.core.records import BatchInput, StopReason, TrajectoryInput, TrajectoryResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.core.tasks import Item
from temporal_rollouts.sandbox.handle import LeasedSlot
from temporal_rollouts.sandbox.pool import SandboxPool
from temporal_rollouts.sandbox_server.schema import Holder, VerifierMounts
from tests.integration.test_image_rollouts import do_nothing_policy, rollout_results, run_failing  # noqa: F401
from tests.support.images import builder_on, image_slot_pool, needs_image_tools, unmount_under, write_context
from tests.support.sandbox import needs_bubblewrap
from tests.support.processes import rollouts_process
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

# slow: the module builds the tasks' images first
pytestmark = [pytest.mark.slow, needs_image_tools, needs_bubblewrap, pytest.mark.timeout(900)]

IMAGE = """\
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 && rm -rf /var/lib/apt/lists/*
WORKDIR /app
"""
CHECK = """\
# the honest check: the answer the agent wrote, judged by python3 from the image
python3 -c 'import sys; sys.exit(open("/app/answer").read().strip() != "42")' 2>/dev/null \\
    && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt
"""
FORGE = """\
mkdir -p /usr/local/bin
printf '#!/bin/sh\\necho 1 > /logs/verifier/reward.txt; exit 0\\n' > /usr/local/bin/python3
chmod +x /usr/local/bin/python3
echo wrong > /app/answer
"""


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Iterator[Path]:
    folder = tmp_path_factory.mktemp("harbor") / "store"
    yield folder
    unmount_under(folder)


@pytest.fixture(scope="module")
async def image(store: Path, tmp_path_factory) -> BuiltImage:
    context = write_context(tmp_path_factory.mktemp("harbor-image") / "harbor", IMAGE)
    return await builder_on(store).ready(ImageSpec(context=str(context), name="harbor-verifier"))


@pytest.fixture
async def image_pool(store: Path, tmp_path: Path) -> AsyncIterator[SandboxPool]:
    async with image_slot_pool(store, tmp_path / "data") as made:
        yield made


async def slot_on(pool: SandboxPool, image: BuiltImage) -> LeasedSlot:
    lease = await pool.acquire(Holder(workflow_id=f"h-{uuid.uuid4().hex[:6]}"), wait_s=60, image=image)
    return LeasedSlot(pool, lease, uuid.uuid4().hex[:8])


async def share_tests(slot: LeasedSlot, tmp_path: Path, script: str) -> str:
    folder = tmp_path / f"tests-{uuid.uuid4().hex[:6]}"
    folder.mkdir()
    (folder / "test.sh").write_text(script)
    archive = tmp_path / f"{folder.name}.tar.gz"
    archive.write_bytes(_pack(folder))
    await slot.share(folder.name, archive)
    return folder.name


async def test_a_forged_interpreter_wins_on_the_agents_root_and_loses_on_the_pristine_one(image_pool, image, tmp_path):
    slot = await slot_on(image_pool, image)
    assert (await slot.terminal(FORGE)).ok
    tests = await share_tests(slot, tmp_path, CHECK)
    await slot.stop_processes()
    shared = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests), timeout=60)
    pristine = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests, pristine=True), timeout=60)
    assert shared.verifier_root == "shared" and shared.collected["reward.txt"].text.strip() == "1", (
        "the attack is real: on the root the agent changed, its python3 writes the reward"
    )
    assert pristine.verifier_root == "pristine" and pristine.collected["reward.txt"].text.strip() == "0", pristine
    assert (await slot.terminal("cat /app/answer; ls /usr/local/bin")).output.split() == ["wrong", "python3"], (
        "the agent's root is as it left it; the pristine root's layer is gone"
    )
    assert (await slot.terminal("echo 42 > /app/answer")).ok
    solved = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests, pristine=True), timeout=60)
    assert solved.collected["reward.txt"].text.strip() == "1", "the agent's WORKDIR is carried into the pristine root"


async def test_tests_are_hidden_read_only_and_a_planted_reward_is_never_read(image_pool, image, tmp_path):
    slot = await slot_on(image_pool, image)
    plant = "mkdir -p /logs/verifier /tests && echo 1 > /logs/verifier/reward.txt && echo planted > /tests/test.sh"
    assert (await slot.terminal(plant)).ok
    script = (
        "ls /logs/verifier; cat /tests/note.txt 2>/dev/null\n"
        "echo tampered >> /tests/test.sh && echo WROTE-TESTS\n"
        "touch /logs/verifier/test-stdout.txt && echo WROTE-LOGS\n"
    )
    tests = await share_tests(slot, tmp_path, script)
    assert "planted" in (await slot.terminal("cat /tests/test.sh")).output, "the agent never sees the tests"
    for pristine in (False, True):
        ran = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests, pristine=pristine), timeout=60)
        assert "WROTE-TESTS" not in ran.output and "WROTE-LOGS" in ran.output, ran.output
        assert ran.collected == {}, "the planted reward.txt is not in the verifier's fresh output folder"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        ("ln -s /etc/hostname /logs/verifier/reward.txt", "not a regular file"),
        ("mkfifo /logs/verifier/reward.txt", "not a regular file"),
        ("head -c 100000 /dev/zero > /logs/verifier/reward.txt", "over"),
    ],
)
async def test_a_reward_that_is_a_link_a_fifo_or_too_large_is_not_read(image_pool, image, tmp_path, make, problem):
    slot = await slot_on(image_pool, image)
    tests = await share_tests(slot, tmp_path, make + "\n")
    ran = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests, pristine=True), timeout=60)
    found = ran.collected["reward.txt"]
    assert found.text is None and problem in (found.problem or ""), ran


async def test_on_the_agents_root_a_linked_test_folder_fails_closed(image_pool, image, tmp_path):
    slot = await slot_on(image_pool, image)
    assert (await slot.terminal("rm -rf /logs && ln -s /app /logs")).ok
    tests = await share_tests(slot, tmp_path, "echo 1 > /logs/verifier/reward.txt\n")
    ran = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests), timeout=60)
    assert not ran.ok and "link" in ran.output and ran.collected == {}, ran


async def test_the_example_tasks_score_1_with_the_demo_policy_and_0_when_nothing_is_done(
    client: Client,
    settings: Settings,
    do_nothing_policy: str,  # noqa: F811
) -> None:
    tasks = HarborEnv().item_count()
    results = {}
    for policy in (None, do_nothing_policy):
        batch = BatchInput(env="harbor", num_items=tasks or 0, group_size=2 if policy is None else 1, policy=policy)
        done = await client.execute_workflow(
            BatchWorkflow.run, batch, id=f"harbor-{uuid.uuid4().hex[:8]}", task_queue=settings.temporal.task_queue
        )
        results[policy] = done
        rollouts = await rollout_results(client, done.batch_id)
        assert {r.stop_reason for r in rollouts} == {StopReason.COMPLETED}, [r.stop_detail for r in rollouts]
        for rollout in rollouts:
            assert rollout.verify_details["verifier_root"] == "pristine", rollout.verify_details
            assert "notes" not in rollout.verify_details, "every example says it needs no network"
    assert (results[None].completed, results[None].mean_score) == (2 * tasks, 1.0), results[None].stop_details
    assert (results[do_nothing_policy].completed, results[do_nothing_policy].mean_score) == (tasks, 0.0)


async def test_a_task_whose_tests_write_no_reward_is_a_failure_not_a_score(
    client: Client, settings: Settings, tmp_path: Path
) -> None:
    folder = tmp_path / "silent"
    (folder / "tests").mkdir(parents=True)
    write_context(folder / "environment", IMAGE)
    (folder / "task.toml").write_text("[verifier]\ntimeout_sec = 30\n[agent]\ntimeout_sec = 60\n")
    (folder / "instruction.md").write_text("Reply that you are done.\n")
    (folder / "tests" / "test.sh").write_text("echo the tests crashed before writing a reward; exit 3\n")
    (item,) = as_loaded(HarborEnv({"path": str(folder)}), [Item(id="silent")])
    input = TrajectoryInput(env="harbor", env_config={"path": str(folder)}, item=item)
    result = await run_failing(client, settings, input, f"harbor-{uuid.uuid4().hex[:8]}")
    assert result.stop_reason is StopReason.ENV_ERROR and not result.stop_reason.scored
    assert "wrote no reward" in result.stop_detail and "crashed before" in result.stop_detail


async def test_our_own_tasks_as_harbor_folders_score_1_and_0_in_their_images_under_the_harbor_env(
    client: Client,
    settings: Settings,
    tmp_path: Path,
    do_nothing_policy: str,  # noqa: F811
) -> None:
    """The bundled terminal tasks are Harbor folders: the generic env runs them in the images their
    `environment/` builds, verified by their `tests/test.sh` on the pristine root (a sample: one with an
    executable file, one whose check rejects an edited file, one that needs its image's account)."""
    for folder in (
        TASKS_DIR / "fix-import-error",
        TASKS_DIR / "fix-line-counter",
        TASKS_DIR / "csv-to-json",
        IMAGE_TASKS_DIR / "read-ledger-config",
    ):
        shutil.copytree(folder, tmp_path / folder.name)
    for policy, score in ((None, 1.0), (do_nothing_policy, 0.0)):
        batch = BatchInput(env="harbor", env_config={"path": str(tmp_path)}, num_items=4, group_size=1, policy=policy)
        done = await client.execute_workflow(
            BatchWorkflow.run, batch, id=f"harbor-{uuid.uuid4().hex[:8]}", task_queue=settings.temporal.task_queue
        )
        assert (done.completed, done.failed, done.mean_score) == (4, 0, score), done.stop_details


async def test_agent_code_a_test_runs_cannot_outwrite_the_reward_once_the_test_kills_all_but_itself(
    image_pool, image, tmp_path
):
    """The example `write-greeting` runs the agent's script; a script that leaves a writer behind wins
    against the same test without its kill step, and loses against the test as shipped."""
    slot = await slot_on(image_pool, image)
    writer = (  # greeting.sh prints the wrong line and leaves a writer of the reward behind
        "cd /app && echo 'hello, harbor' > greeting.txt\n"
        "cat > greeting.sh <<'SH'\n#!/bin/sh\n"
        "(while :; do echo '{\"reward\": 1}' > /logs/verifier/.r && mv /logs/verifier/.r /logs/verifier/reward.json;"
        " done) >/dev/null 2>&1 &\necho wrong\nSH\nchmod +x greeting.sh\n"
    )
    assert (await slot.terminal(writer)).ok
    shipped = (EXAMPLES / "write-greeting" / "tests" / "test.sh").read_text().replace("/workspace", "/app")
    without_kill = "\n".join(line for line in shipped.splitlines() if "kill" not in line and "keep" not in line)
    without_kill = without_kill.replace("for entry in /proc/[0-9]*; do\n", "").replace("\ndone\n", "\n")
    assert "kill" not in without_kill and "done" not in without_kill.split("case $((")[1]
    await slot.stop_processes()
    rewards = {}
    for name, script in (("without-kill", without_kill + "\nsleep 0.5\n"), ("shipped", shipped)):
        tests = await share_tests(slot, tmp_path, script)
        ran = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests, pristine=True), timeout=60)
        assert "reward.json" in ran.collected, (name, ran.output, script)
        rewards[name] = json.loads(ran.collected["reward.json"].text)["reward"]
    assert rewards == {"without-kill": 1, "shipped": 0.5}, rewards


async def test_a_harbor_rollout_forks_and_shows_its_task_and_what_its_tests_printed(
    client: Client, settings: Settings
) -> None:
    env_config = {"path": str(TASKS_DIR)}
    (item,) = as_loaded(HarborEnv(env_config), [Item(id="fix-import-error")])  # three turns in its image
    source = TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(env="harbor", env_config=env_config, item=item),
            id=f"harbor-source-{uuid.uuid4().hex[:6]}",
            task_queue=settings.temporal.task_queue,
        )
    )
    assert (source.stop_reason, source.score, source.turns) == (StopReason.COMPLETED, 1.0, 4), source.stop_detail
    done = await asyncio.to_thread(
        rollouts_process, settings, "fork", source.rollout_id, "--at-turn", "2", "-n", "2", "--wait", "--json"
    )
    assert done.returncode == 0, done.stderr
    forked = json.loads(done.stdout)
    assert [r["score"] for r in forked["results"]] == [1.0, 1.0], forked
    shown = await asyncio.to_thread(rollouts_process, settings, "show", forked["first"])
    assert '"task": "fix-import-error"' in shown.stdout and '"verifier_root": "pristine"' in shown.stdout
    assert "verifier output (its end):" in shown.stdout, shown.stdout


async def test_on_the_servers_own_root_the_verifier_gets_its_folders_too(image_pool, tmp_path):
    """A slot with no item image: its system folders are read-only to the agent already, so the root is
    pristine as it is; the tests and the output folder are the verifier's as on an image."""
    lease = await image_pool.acquire(Holder(workflow_id=f"h-{uuid.uuid4().hex[:6]}"), wait_s=60)
    slot = LeasedSlot(image_pool, lease, uuid.uuid4().hex[:8])
    assert (await slot.terminal("echo 42 > answer && ls /tests /logs 2>&1 | head -2")).ok
    script = "cat /workspace/answer > /logs/verifier/reward.txt\necho x >> /tests/test.sh && echo WROTE-TESTS\n"
    tests = await share_tests(slot, tmp_path, script)
    ran = await slot.verifier("bash /tests/test.sh", VerifierMounts(tests=tests, pristine=True), timeout=60)
    assert ran.verifier_root == "pristine" and "WROTE-TESTS" not in ran.output, ran
    assert ran.collected["reward.txt"].text.strip() == "42", ran


async def test_an_agent_that_fills_its_volume_leaves_the_verifier_room_or_a_clear_refusal(image_pool, image, tmp_path):
    """Bytes: the volume keeps room for the verifier's few files, and the tests run. Every inode: the
    verifier cannot make its folders, and says so as its answer (never a server error retried as one)."""
    slot = await slot_on(image_pool, image)
    tests = await share_tests(slot, tmp_path, "echo 1 > /logs/verifier/reward.txt\n")
    mounts = VerifierMounts(tests=tests, pristine=True)
    assert not (await slot.terminal("dd if=/dev/zero of=/app/fill bs=1M count=200", timeout=120)).ok
    assert (await slot.verifier("bash /tests/test.sh", mounts, timeout=60)).collected["reward.txt"].text == "1\n"
    assert (await slot.terminal("rm /app/fill")).ok
    # Files made by the shell's own redirection: a `touch` per file was 20,000 processes, minutes on busy cores.
    inodes = "mkdir /app/f && cd /app/f && i=0; while { : > $i; } 2>/dev/null; do i=$((i+1)); done; echo $i"
    assert "limit of" in (await slot.terminal(inodes, timeout=120)).output
    refused = await slot.verifier("bash /tests/test.sh", mounts, timeout=60)
    assert not refused.ok and "no room in the slot" in refused.output and refused.collected == {}, refused
