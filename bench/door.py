"""The trainer door under chaos: is any batch lost, acknowledged twice, or trained too stale?

    python bench/door.py                     # 24 groups of 4 (12 batches), the chaos schedule below
    python bench/door.py --groups 8 --quick

One training run (`sink: door`) stores echo_chain groups (SmolLM2-135M on CPU behind the CPU
`/generate` server, steered by the demo policy); a stand-in trainer in its own process takes each
batch through the door's endpoint with the Python client, "trains" for two seconds, has the
policy server load weights as the next version and acknowledges. The trainer writes what it took
and acknowledged to a ledger file as it goes. While the run goes on, on a schedule:

- the trainer is SIGKILLed mid-batch (taken, not acknowledged), twice, and started again: the
  batch it held is handed out again once its lease runs out;
- the door's endpoint is SIGKILLed and started again 3 s later (the trainer's client retries);
- `python worker.py` is SIGKILLed and started again 3 s later.

It ends with one JSON line: batches formed / acknowledged / lost (goal 0), batches acknowledged
twice (goal 0), groups and tokens: each group in exactly one acknowledged batch, and the
generated tokens acknowledged or counted as held back for staleness (goal: all of them, once),
staleness at consumption (goal: within the bound), re-deliveries, the kills, wall time and the
load average before and after.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import httpx  # noqa: E402

from bench import quiet  # noqa: E402
from bench.procs import _spawn, run_in_data_dir  # noqa: E402
from bench.training_stack import (  # noqa: E402
    POLICY,
    POLICY_KEY_ENV,
    TrainingStack,
    served_weights_on_disk,
    training_stack,
)
from temporal_rollouts.core.feed import FeedInput, FeedStatus  # noqa: E402
from temporal_rollouts.core.records import RolloutLimits, Sampling  # noqa: E402
from temporal_rollouts.door.client import DoorClient, RunEnded  # noqa: E402
from workflows.feed import TrainingFeedWorkflow  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
TEMPLATE = REPO / "tests" / "data" / "templates" / "qwen2_5.jinja"
GROUP_SIZE = 4
GROUPS_PER_BATCH = 2
MAX_STALENESS = 1
LEASE_S = 15.0
TRAIN_S = 2.0
IGNORE_INDEX = -100


# ---------------------------------------------------------------------------------- the trainer process


def trainer_main(door_url: str, run: str, ledger: Path, policy_url: str, weights: Path) -> None:
    """Take, "train", publish, acknowledge, until the run is done; every take and ack goes to `ledger`."""

    def record(event: dict) -> None:
        with open(ledger, "a") as out:
            out.write(json.dumps(event) + "\n")
            out.flush()
            os.fsync(out.fileno())

    with DoorClient(door_url, consumer=f"trainer-{os.getpid()}") as door:
        while True:
            try:
                batch = door.take(run, lease_s=LEASE_S)
            except RunEnded:
                return
            if batch is None:
                time.sleep(0.5)
                continue
            groups = [
                {
                    "group_id": g["group_overrides"]["group_id"],
                    "staleness": g["group_overrides"]["staleness"],
                    "stale": g["group_overrides"]["stale"],
                    "held_back": g["group_overrides"].get("held_back", False),
                    "tokens": sum(1 for mask in g["masks"] for m in mask if m != IGNORE_INDEX),
                }
                for g in batch.groups
            ]
            record(
                {
                    "event": "take",
                    "pid": os.getpid(),
                    "number": batch.number,
                    "deliveries": batch.deliveries,
                    "groups": groups,
                }
            )
            time.sleep(TRAIN_S)  # the training step
            version = batch.trainer_version + 1
            while True:  # publish as a trainer does; the model server may be busy, never down here
                try:
                    answer = httpx.post(
                        f"{policy_url}/update_weights_from_disk",
                        json={"model_path": str(weights), "weight_version": str(version)},
                        headers={"Authorization": f"Bearer {os.environ[POLICY_KEY_ENV]}"},
                        timeout=600,
                    ).json()
                    if answer.get("success"):
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(1)
            record({"event": "ack", "number": batch.number, "status": batch.ack()})


# ---------------------------------------------------------------------------------- the bench


class TrainerProcess:
    def __init__(self, stack: TrainingStack, run: str, ledger: Path, weights: Path) -> None:
        self.stack, self.run, self.ledger, self.weights = stack, run, ledger, weights
        self.proc = None

    def start(self) -> None:
        argv = [sys.executable, __file__, "--trainer", self.stack.door_url, self.run, str(self.ledger)]
        argv += [self.stack.policy_url, str(self.weights)]
        self.proc = _spawn(argv, self.stack.data_dir / "trainer.log", env=self.stack.env_vars())
        self.stack.processes["trainer"] = self.proc

    def events(self) -> list[dict]:
        if not self.ledger.exists():
            return []
        return [json.loads(line) for line in self.ledger.read_text().splitlines() if line.strip()]

    def mid_batch(self) -> bool:
        """The running trainer holds a batch it took and has not acknowledged."""
        events = self.events()
        return bool(events) and events[-1]["event"] == "take" and events[-1]["pid"] == getattr(self.proc, "pid", None)


async def chaos(stack: TrainingStack, trainer: TrainerProcess, scale: float, done: asyncio.Event) -> list[str]:
    log: list[str] = []

    async def note(what: str) -> None:
        log.append(what)
        print(f"  chaos: {what}", flush=True)

    async def kill_trainer_mid_batch() -> None:
        while not trainer.mid_batch() and not done.is_set():
            await asyncio.sleep(0.05)
        if done.is_set():
            return
        stack.kill("trainer")
        await note("SIGKILL the trainer mid-batch")
        await asyncio.sleep(1)
        trainer.start()

    await asyncio.sleep(20 * scale)
    await kill_trainer_mid_batch()
    await asyncio.sleep(15 * scale)
    stack.kill("door")
    await note("SIGKILL the door's endpoint")
    await asyncio.sleep(3)
    await stack.start_door()
    await asyncio.sleep(15 * scale)
    stack.kill("worker")
    await note("SIGKILL the worker")
    await asyncio.sleep(3)
    await stack.start_worker()
    await asyncio.sleep(15 * scale)
    await kill_trainer_mid_batch()
    return log


def account(events: list[dict], status: FeedStatus) -> dict:
    """What the trainer's ledger and the run's figures say, against the goals."""
    assert status.door is not None
    d, f = status.door.figures, status.figures
    taken: dict[int, dict] = {}
    acked = Counter()
    for event in events:
        if event["event"] == "take":
            taken[event["number"]] = event  # a re-delivery hands out the same groups
        elif event["status"] == "acknowledged":
            acked[event["number"]] += 1
    trained = [g for number in acked for g in taken[number]["groups"] if not g["held_back"]]
    groups = Counter(g["group_id"] for g in trained)  # a held-back group (masked whole) is counted as held back
    staleness = Counter(g["staleness"] for g in trained)
    return {
        "batches_formed": d.batches_formed,
        "batches_acknowledged": d.batches_acknowledged,
        "batches_lost": d.batches_formed - len(acked),
        "batches_acknowledged_twice": sum(1 for count in acked.values() if count > 1),
        "acks_answered_already": d.acks_repeated,
        "batches_redelivered": d.batches_redelivered,
        "leases_expired": d.leases_expired,
        "groups_stored": f.groups_posted,
        "groups_acknowledged": len(groups),
        "groups_in_two_batches": sum(1 for count in groups.values() if count > 1),
        "groups_held_back_stale": d.groups_requeued + d.groups_dropped_stale,
        "groups_lost": f.groups_posted - len(groups) - d.groups_requeued - d.groups_dropped_stale,
        "groups_dropped": f.dropped,
        "tokens_generated": f.tokens_generated,
        "tokens_acknowledged": d.completion_tokens_acknowledged,
        "tokens_held_back_stale": d.completion_tokens_held_back,
        "tokens_unaccounted": f.tokens_generated - d.completion_tokens_acknowledged - d.completion_tokens_held_back,
        "trained_tokens_at_trainer": sum(g["tokens"] for g in trained),
        "trained_tokens_acknowledged": d.tokens_acknowledged,
        "staleness_at_consumption": {str(k): staleness[k] for k in sorted(staleness)},
        "stale_groups_trained": sum(1 for g in trained if g["stale"]),
    }


async def amain(data_dir: Path, args: argparse.Namespace) -> dict:
    weights = await served_weights_on_disk(data_dir)  # the same weights, loaded as each new version
    async with training_stack(
        data_dir, slots=8, chat_template=TEMPLATE, steered=True, policy_args=("--threads", "1")
    ) as stack:
        run = f"door-bench-{uuid.uuid4().hex[:6]}"
        feed = FeedInput(
            env="echo_chain",
            env_config={"steps": 2},
            policy=POLICY,
            group_size=GROUP_SIZE,
            batch_size=GROUP_SIZE * GROUPS_PER_BATCH,
            max_groups=args.groups,
            max_staleness=MAX_STALENESS,
            stale_groups="requeue",
            max_retries=4,
            sampling=Sampling(temperature=1.0, max_tokens=6),
            limits=RolloutLimits(max_turns=4),
        )
        started = time.monotonic()
        handle = await stack.client.start_workflow(
            TrainingFeedWorkflow.run, feed, id=run, task_queue=stack.settings.temporal.task_queue
        )
        trainer = TrainerProcess(stack, run, data_dir / "trainer-ledger.jsonl", weights)
        trainer.start()
        done = asyncio.Event()
        chaos_task = asyncio.create_task(chaos(stack, trainer, 0.3 if args.quick else 1.0, done))
        while True:
            status = await stack_status(stack, handle)
            if status is not None:
                d = status.door
                print(
                    f"  {time.monotonic() - started:6.0f}s  {status.phase:24s} groups {status.figures.groups_posted:3d}"
                    f"/{args.groups}  batches acknowledged {d.figures.batches_acknowledged if d else 0:3d}  "
                    f"re-delivered {d.figures.batches_redelivered if d else 0}",
                    flush=True,
                )
                if status.phase == "done":
                    break
            await asyncio.sleep(5)
        done.set()
        chaos_log = await chaos_task
        wall = time.monotonic() - started
        if trainer.proc is not None:
            await asyncio.to_thread(trainer.proc.wait, 60)
        kills = dict(stack.kills)
        report = {
            "benchmark": "door",
            "groups": args.groups,
            "group_size": GROUP_SIZE,
            "groups_per_batch": GROUPS_PER_BATCH,
            "max_staleness": MAX_STALENESS,
            "lease_s": LEASE_S,
            **account(trainer.events(), status),
            "chaos": chaos_log,
            "kills": kills,
            "wall_s": round(wall, 1),
            **args.host.report(),
        }
    report["goals"] = {
        "no_batch_lost": report["batches_lost"] == 0 and report["groups_lost"] == 0,
        "none_acknowledged_twice": report["batches_acknowledged_twice"] == 0 and report["groups_in_two_batches"] == 0,
        "every_token_once": report["tokens_unaccounted"] == 0
        and report["trained_tokens_at_trainer"] == report["trained_tokens_acknowledged"],
        "staleness_within_bound": report["stale_groups_trained"] == 0
        and all(int(k) <= MAX_STALENESS for k in report["staleness_at_consumption"]),
        "chaos_happened": kills.get("trainer", 0) == 2 and kills.get("door") == 1 and kills.get("worker") == 1,
    }
    print(
        "\nbatches: {batches_formed} formed, {batches_acknowledged} acknowledged, {batches_lost} lost, "
        "{batches_acknowledged_twice} acknowledged twice ({acks_answered_already} repeated acks answered), "
        "{batches_redelivered} re-delivered after {leases_expired} leases ran out".format(**report)
    )
    print(
        "groups: {groups_stored} stored, {groups_acknowledged} acknowledged, {groups_in_two_batches} in two batches, "
        "{groups_held_back_stale} held back for staleness, {groups_lost} lost".format(**report)
    )
    print(
        "tokens: {tokens_generated} generated = {tokens_acknowledged} acknowledged + {tokens_held_back_stale} held "
        "back ({tokens_unaccounted} unaccounted); trained tokens at the trainer {trained_tokens_at_trainer}, "
        "acknowledged {trained_tokens_acknowledged}".format(**report)
    )
    print(
        "staleness at consumption {staleness_at_consumption} (bound {max_staleness}); kills {kills}; "
        "wall {wall_s}s".format(**report)
    )
    print(json.dumps(report))
    return report


async def stack_status(stack: TrainingStack, handle) -> FeedStatus | None:
    try:
        return FeedStatus.model_validate(await handle.query(TrainingFeedWorkflow.status))
    except Exception as err:  # noqa: BLE001  (no worker answers a query while the chaos has killed it)
        print(f"  (no answer to the status query: {err})", flush=True)
        return None


def main(argv: list[str] | None = None) -> int:
    if argv is None and sys.argv[1:2] == ["--trainer"]:
        trainer_main(sys.argv[2], sys.argv[3], Path(sys.argv[4]), sys.argv[5], Path(sys.argv[6]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=24, help="groups the run makes (x4 rollouts)")
    parser.add_argument("--quick", action="store_true", help="shorter intervals between the kills")
    parser.add_argument("--keep", action="store_true", help="keep the data folder (logs, the trainer's ledger)")
    quiet.add_argument(parser)
    args = parser.parse_args(argv)
    args.host = quiet.check_host(args.allow_busy)
    return run_in_data_dir("bench-door-", args.keep, lambda data_dir: amain(data_dir, args))


if __name__ == "__main__":
    sys.exit(main())
