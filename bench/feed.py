"""The training feed under chaos: does anything get lost, sent twice or posted too stale?

    python bench/feed.py                    # 50 groups of 4 (200 rollouts), the chaos schedule below
    python bench/feed.py --groups 10 --quick

One training run (a TrainingFeedWorkflow) feeds the real `run-api`; a stand-in trainer pulls
batches, "trains" for a second, has the policy server load weights as version `step` after each
step (as a trainer that publishes every step does; it waits out the model outage) and pauses
once for 30 s. The policy is SmolLM2-135M on CPU behind the
CPU `/generate` server, steered by the demo policy through echo_chain's two tool calls. While
it runs, on a schedule: `python worker.py` is SIGKILLed and restarted, the Atropos env process
(`serve`, attached to the run) is SIGKILLed and restarted, the sandbox server is SIGKILLed (its
pool restarts it), and the model server is down for 60 s.

It prints what happened and ends with one JSON line: rollouts started / completed / orphaned
(goal 0), groups posted / duplicated at the trainer (goal 0) / dropped by reason, tokens posted
over tokens generated (goal >= 0.99), staleness at posting (goal: within max_staleness) and at
consumption, mean turns of finished against posted rollouts, the kills, wall time, and the load
average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402
from temporalio.service import RPCError  # noqa: E402

from bench import quiet  # noqa: E402
from bench.procs import run_in_data_dir  # noqa: E402
from bench.training_stack import POLICY, TrainingStack, served_weights_on_disk, training_stack  # noqa: E402
from temporal_rollouts.core.feed import FeedInput, FeedStatus  # noqa: E402
from temporal_rollouts.core.records import RolloutLimits, Sampling  # noqa: E402
from temporal_rollouts.sinks.atropos_api import TrajectoryApi  # noqa: E402
from workflows.feed import TrainingFeedWorkflow  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "tests" / "data" / "templates" / "qwen2_5.jinja"
GROUP_SIZE = 4
GROUPS_PER_STEP = 4
MAX_STALENESS = 2
PAUSE_AT_STEP, PAUSE_S = 3, 30.0


class StandInTrainer:
    """Pulls batches as a trainer does, counts what it got, and changes the policy's weights."""

    def __init__(self, stack: TrainingStack, weights: Path) -> None:
        self.stack, self.weights = stack, weights
        self.step = 0
        self.group_ids: Counter[str] = Counter()
        self.consumed_staleness: Counter[int] = Counter()
        self.versions_loaded: list[int] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with TrajectoryApi(self.stack.run_api_url) as api:
            await api.register_trainer(
                wandb_group="bench",
                wandb_project="bench",
                batch_size=GROUP_SIZE * GROUPS_PER_STEP,
                max_token_len=4096,
                checkpoint_dir=str(self.stack.data_dir),
                save_checkpoint_interval=-1,
                starting_step=0,
                num_steps=10**6,
            )
            while not stop.is_set():
                batch = await api.batch()
                if batch is None:
                    await asyncio.sleep(0.5)
                    continue
                self.step += 1
                for group in batch:
                    overrides = group.get("group_overrides") or {}
                    self.group_ids[overrides.get("group_id")] += 1
                    if overrides.get("policy_version_min") is not None:
                        self.consumed_staleness[self.step - 1 - overrides["policy_version_min"]] += 1
                await asyncio.sleep(1.0)  # the training step
                await self.publish(self.step)
                if self.step == PAUSE_AT_STEP:
                    print(f"  trainer pauses {PAUSE_S:.0f}s at step {self.step}", flush=True)
                    await asyncio.sleep(PAUSE_S)

    async def publish(self, version: int) -> None:
        """Have the server load the weights as `version`, as a trainer does after each step; while the model
        server is down (the chaos's outage) a trainer waits for it, so this does too."""
        while True:
            try:
                await self.stack.update_weights(self.weights, version)
                self.versions_loaded.append(version)
                return
            except httpx.HTTPError:
                await asyncio.sleep(2)


async def chaos(stack: TrainingStack, run: str, env_fields: dict, quick: bool) -> None:
    scale = 0.3 if quick else 1.0
    outage = 20.0 if quick else 60.0
    await asyncio.sleep(20 * scale)
    print("  chaos: SIGKILL the worker", flush=True)
    stack.kill("worker")
    await asyncio.sleep(3)
    await stack.start_worker()
    await asyncio.sleep(15 * scale)
    print("  chaos: SIGKILL the env process (serve)", flush=True)
    stack.kill("env")
    await asyncio.sleep(5)
    stack.start_env(run, **env_fields)
    await asyncio.sleep(15 * scale)
    print("  chaos: SIGKILL the sandbox server", flush=True)
    stack.kill_sandbox()
    await asyncio.sleep(15 * scale)
    print(f"  chaos: the model server is down for {outage:.0f}s", flush=True)
    stack.kill("policy_server")
    await asyncio.sleep(outage)
    await stack.start_policy()
    print("  chaos: the model server is back", flush=True)


async def orphans(stack: TrainingStack, run: str) -> int:
    """Rollouts of the run still running once the run is done."""
    running = set()
    query = f"RolloutBatchId = '{run}' AND WorkflowType = 'TrajectoryWorkflow' AND ExecutionStatus = 'Running'"
    async for execution in stack.client.list_workflows(query):
        running.add(execution.id)
    return len(running)


async def amain(data_dir: Path, args: argparse.Namespace) -> dict:
    weights = await served_weights_on_disk(data_dir)  # the same weights, loaded as each new version
    async with training_stack(
        data_dir, slots=8, chat_template=TEMPLATE, steered=True, policy_args=("--threads", "1")
    ) as stack:
        run = f"feed-bench-{uuid.uuid4().hex[:6]}"
        feed = FeedInput(
            env="echo_chain",
            env_config={"steps": 2},
            policy=POLICY,
            group_size=GROUP_SIZE,
            max_groups=args.groups,
            max_groups_in_flight=GROUPS_PER_STEP * (MAX_STALENESS + 1),
            max_staleness=MAX_STALENESS,
            max_retries=4,
            sink="atropos",
            sampling=Sampling(temperature=1.0, max_tokens=6),
            limits=RolloutLimits(max_turns=4),
        )
        started = time.monotonic()
        handle = await stack.client.start_workflow(
            TrainingFeedWorkflow.run, feed, id=run, task_queue=stack.settings.temporal.task_queue
        )
        env_fields = {"env_config": {"steps": 2}, "group_size": GROUP_SIZE}
        stack.start_env(run, **env_fields)
        trainer = StandInTrainer(stack, weights)
        stop = asyncio.Event()
        trainer_task = asyncio.create_task(trainer.run(stop))
        chaos_task = asyncio.create_task(chaos(stack, run, env_fields, args.quick))
        status = None
        while True:
            try:
                status = FeedStatus.model_validate(await handle.query(TrainingFeedWorkflow.status))
            except RPCError as err:  # a query needs a worker: none answers while the chaos has killed it
                print(
                    f"  {time.monotonic() - started:6.0f}s  (no answer to the status query: {err.message})", flush=True
                )
                await asyncio.sleep(5)
                continue
            print(
                f"  {time.monotonic() - started:6.0f}s  {status.phase:24s} posted {status.figures.groups_posted:3d}/"
                f"{args.groups}  in flight {status.in_flight:2d}  resumed {status.figures.rollouts_retried:2d}  "
                f"trainer step {trainer.step}",
                flush=True,
            )
            if status.phase == "done":
                break
            await asyncio.sleep(5)
        await chaos_task
        await asyncio.sleep(3)  # the trainer takes the last full batch
        stop.set()
        await trainer_task
        wall = time.monotonic() - started
        orphaned = await orphans(stack, run)
        kills = dict(stack.kills)
    f = status.figures
    duplicated = sum(count - 1 for count in trainer.group_ids.values() if count > 1)
    posted_rollouts = f.groups_posted * GROUP_SIZE
    report = {
        "benchmark": "feed",
        "groups": args.groups,
        "group_size": GROUP_SIZE,
        "max_staleness": MAX_STALENESS,
        "rollouts_started": f.rollouts_started,
        "rollouts_completed": f.rollouts_finished,
        "rollouts_resumed": f.rollouts_retried,
        "rollouts_orphaned": orphaned,
        "groups_posted": f.groups_posted,
        "groups_duplicated_at_trainer": duplicated,
        "duplicates_prevented": f.groups_duplicated,
        "groups_dropped": f.dropped,
        "groups_consumed": sum(trainer.group_ids.values()),
        "tokens_generated": f.tokens_generated,
        "tokens_posted": f.tokens_posted,
        "tokens_posted_ratio": round(f.tokens_posted / f.tokens_generated, 4) if f.tokens_generated else None,
        "staleness_at_posting": {k: f.staleness[k] for k in sorted(f.staleness, key=int)},
        "max_staleness_at_posting": max((int(k) for k in f.staleness), default=None),
        "staleness_at_consumption": dict(sorted(trainer.consumed_staleness.items())),
        "mean_turns_finished": round(f.turns_finished / f.rollouts_finished, 3) if f.rollouts_finished else None,
        "mean_turns_posted": round(f.turns_posted / posted_rollouts, 3) if posted_rollouts else None,
        "weight_versions_loaded": trainer.versions_loaded,
        "trainer_steps": trainer.step,
        "kills": kills,
        "model_outage_s": 20.0 if args.quick else 60.0,
        "wall_s": round(wall, 1),
        **args.host.report(),
    }
    print(
        "\nrollouts: {rollouts_started} started, {rollouts_completed} completed, {rollouts_resumed} resumed, "
        "{rollouts_orphaned} orphaned".format(**report)
    )
    print(
        "groups: {groups_posted} posted, {groups_duplicated_at_trainer} duplicated at the trainer "
        "({duplicates_prevented} repeat posts prevented), dropped {groups_dropped}".format(**report)
    )
    print("tokens: {tokens_posted} posted of {tokens_generated} generated ({tokens_posted_ratio})".format(**report))
    print(
        "staleness at posting {staleness_at_posting} (bound {max_staleness}); at consumption "
        "{staleness_at_consumption}".format(**report)
    )
    print(
        "mean turns: {mean_turns_finished} finished, {mean_turns_posted} posted; versions loaded "
        "{weight_versions_loaded}; kills {kills}; wall {wall_s}s".format(**report)
    )
    print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=50, help="groups to post (x4 rollouts)")
    parser.add_argument("--quick", action="store_true", help="shorter chaos intervals and a 20 s outage")
    parser.add_argument("--keep", action="store_true", help="keep the data folder (logs) afterwards")
    quiet.add_argument(parser)
    args = parser.parse_args(argv)
    args.host = quiet.check_host(args.allow_busy)
    return run_in_data_dir("bench-feed-", args.keep, lambda data_dir: amain(data_dir, args))


if __name__ == "__main__":
    sys.exit(main())
