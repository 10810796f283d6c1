"""Forks and branches: what a tree of k branches at turn t saves, and what rebuilding a workspace costs.

Runs echo_chain rollouts of S steps (S+1 model turns) with the demo policy through a real
worker process, sandbox and Temporal dev server, every workspace carrying `ballast_kb` of
random bytes so that snapshots and copies move what a real workspace would.

1. Tree against independent rollouts: k independent rollouts of one task, then one rollout
   branching at turn t into k (a batch with `branch`). Model requests, generated tokens (the
   demo policy's usage) and wall time of each; a prefix alone (max_turns = t) gives the
   prefix's tokens P, and the tree should save (k-1) x P: (k-1)/k of the k prefixes.
2. Rebuilding a workspace: a rollout with `snapshot_turns` (the snapshot's size and time per
   turn, from its history, and its wall time against one without), then a fork at turn t
   restored from that snapshot, a fork rebuilt by replaying t tool calls, and the live copies
   of part 1's branches (each fork's `setup` time).

    python bench/fork.py --quick     # S=6, t=4, k=4, 2 MB workspaces: about two minutes on two busy cores
    python bench/fork.py             # S=10, t=8, k=4 and 8, 2 MB and 32 MB
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.procs import services  # noqa: E402
from temporal_rollouts.client.forks import start_fork  # noqa: E402
from temporal_rollouts.core.records import BatchInput, RolloutLimits, TrajectoryInput, TrajectoryResult  # noqa: E402
from temporal_rollouts.core.tasks import Item  # noqa: E402
from temporal_rollouts.core.trees import RolloutTreeResult  # noqa: E402
from temporal_rollouts.runtime.temporal import connect  # noqa: E402
from workflows.batch import BatchWorkflow  # noqa: E402
from workflows.trajectory import TrajectoryWorkflow  # noqa: E402


class Bench:
    def __init__(self, stack, client, steps: int, ballast_kb: int) -> None:
        self.stack, self.client, self.steps, self.ballast_kb = stack, client, steps, ballast_kb
        self.queue = stack.settings.temporal.task_queue
        self.policy_stats = f"http://127.0.0.1:{stack.settings.demo_policy.port}/stats"

    def env_config(self) -> dict[str, Any]:
        return {"steps": self.steps, "ballast_kb": self.ballast_kb}

    def requests(self) -> int:
        return httpx.get(self.policy_stats, timeout=10).json()["total"]

    async def rollout(self, **fields) -> TrajectoryResult:
        item = Item(id=f"echo-{uuid.uuid4().int % 10**6}")
        return TrajectoryResult.model_validate(
            await self.client.execute_workflow(
                TrajectoryWorkflow.run,
                TrajectoryInput(env="echo_chain", item=item, env_config=self.env_config(), **fields),
                id=f"bench-fork-{uuid.uuid4().hex[:8]}",
                task_queue=self.queue,
            )
        )

    async def batch(self, **fields) -> tuple[list[TrajectoryResult], float, int]:
        """(every rollout's result, wall seconds, model requests) of a one-item batch."""
        before, started = self.requests(), time.perf_counter()
        batch = BatchInput(
            env="echo_chain", env_config=self.env_config(), num_items=1, item_offset=uuid.uuid4().int % 10**6, **fields
        )
        result = await self.client.execute_workflow(
            BatchWorkflow.run, batch, id=f"bench-fork-{uuid.uuid4().hex[:8]}", task_queue=self.queue
        )
        wall = time.perf_counter() - started
        ids = [
            e.id
            async for e in self.client.list_workflows(
                f"RolloutBatchId = '{result.batch_id}' AND WorkflowType = 'TrajectoryWorkflow'"
            )
        ]
        results = [TrajectoryResult.model_validate(await self.client.get_workflow_handle(i).result()) for i in set(ids)]
        assert len(results) == result.completed and result.failed == 0 and result.mean_score == 1.0, result
        return results, wall, self.requests() - before

    async def tree_against_independent(self, turn: int, k: int) -> dict[str, Any]:
        prefix = await self.rollout(limits=RolloutLimits(max_turns=turn))
        alone, alone_wall, alone_requests = await self.batch(group_size=k)
        tree, tree_wall, tree_requests = await self.batch(group_size=1, branch={"at_turns": [turn], "factor": k})
        alone_tokens = sum(r.completion_tokens for r in alone)
        tree_tokens = sum(r.completion_tokens for r in tree)
        copies = [r.timings.get("setup", 0.0) for r in tree if r.fork is not None]
        return {
            "k": k,
            "turn": turn,
            "prefix_tokens": prefix.completion_tokens,
            "independent": {"requests": alone_requests, "tokens": alone_tokens, "wall_s": round(alone_wall, 2)},
            "tree": {"requests": tree_requests, "tokens": tree_tokens, "wall_s": round(tree_wall, 2)},
            "saved_of_prefixes": round((alone_tokens - tree_tokens) / (k * prefix.completion_tokens), 3),
            "goal": round((k - 1) / k, 3),
            "copy_s": round(statistics.median(copies), 3) if copies else None,
            "copied_in_place": sum(1 for r in tree if r.fork and r.fork.copied_in_place),
        }

    async def rebuild_costs(self, turn: int) -> dict[str, Any]:
        plain = await self.rollout()
        kept = await self.rollout(snapshot_turns=True)
        snapshots = await self.snapshot_steps(kept.rollout_id)
        sizes = [p.stat().st_size for p in self.snapshot_files(kept.rollout_id)]
        restored = await self.fork(kept.rollout_id, turn, "snapshot")
        replayed = await self.fork(plain.rollout_id, turn, "replay")
        assert (
            restored.fork
            and restored.fork.workspace == "snapshot"
            and replayed.fork
            and replayed.fork.workspace == "replay"
        )
        return {
            "snapshot_bytes": int(statistics.median(sizes)),
            "snapshot_s_per_turn": round(statistics.median(snapshots), 3),
            "snapshots": len(snapshots),
            "rollout_wall_s": {"without": plain.timings["total"], "with_turn_snapshots": kept.timings["total"]},
            "restore_s": restored.timings.get("setup"),
            "replay_s": replayed.timings.get("setup"),
            "replayed_calls": replayed.fork.replayed_calls,
        }

    async def fork(self, source: str, turn: int, rebuild: str) -> TrajectoryResult:
        handle, _, _ = await start_fork(self.client, self.stack.settings, source, turn, 1, rebuild=rebuild)
        (result,) = RolloutTreeResult.model_validate(await handle.result()).results
        assert result.score == 1.0, result.stop_detail
        return result

    async def snapshot_steps(self, rollout: str) -> list[float]:
        """Seconds from scheduled to completed of each snapshot_workspace step in the rollout's history."""
        history = await self.client.get_workflow_handle(rollout).fetch_history()
        scheduled: dict[int, float] = {}
        seconds = []
        for event in history.events:
            if event.HasField("activity_task_scheduled_event_attributes"):
                if event.activity_task_scheduled_event_attributes.activity_type.name == "snapshot_workspace":
                    scheduled[event.event_id] = event.event_time.ToDatetime().timestamp()
            elif event.HasField("activity_task_completed_event_attributes"):
                started = scheduled.get(event.activity_task_completed_event_attributes.scheduled_event_id)
                if started is not None:
                    seconds.append(event.event_time.ToDatetime().timestamp() - started)
        return seconds

    def snapshot_files(self, rollout: str) -> list[Path]:
        settings = self.stack.settings
        return sorted(
            (settings.storage_path / settings.storage.bucket / "snapshots" / rollout / "turns").glob("*.tar.gz")
        )


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--steps", type=int, default=None, help="echo steps per rollout (S)")
    parser.add_argument("--turn", type=int, default=None, help="the branch turn (t)")
    parser.add_argument("--factor", type=int, nargs="+", default=None, help="branches per tree (k)")
    parser.add_argument("--ballast-kb", type=int, nargs="+", default=None, help="workspace sizes")
    args = parser.parse_args(argv)
    steps = args.steps or (6 if args.quick else 10)
    turn = args.turn or steps - 2
    factors = args.factor or ([4] if args.quick else [4, 8])
    ballasts = args.ballast_kb or ([2048] if args.quick else [2048, 32768])
    report: dict[str, Any] = {"steps": steps, "turn": turn, "trees": [], "rebuild": []}
    with tempfile.TemporaryDirectory(prefix="rollouts-bench-fork-") as tmp:
        async with services(Path(tmp), slots=max(factors) + 2, worker="process", db_file=False) as stack:
            client = await connect(stack.settings, start_embedded=False)
            for ballast in ballasts:
                bench = Bench(stack, client, steps, ballast)
                for k in factors:
                    row = await bench.tree_against_independent(turn, k)
                    row["ballast_kb"] = ballast
                    report["trees"].append(row)
                    alone, tree = row["independent"], row["tree"]
                    print(
                        f"k={k} t={turn} workspace {ballast // 1024} MB: independent {alone['requests']} requests, "
                        f"{alone['tokens']} tokens, {alone['wall_s']} s | tree {tree['requests']} requests, "
                        f"{tree['tokens']} tokens, {tree['wall_s']} s | prefix {row['prefix_tokens']} tokens, "
                        f"saved {row['saved_of_prefixes']:.0%} of the k prefixes (goal {row['goal']:.0%}) | "
                        f"live copy {row['copy_s']} s ({row['copied_in_place']} in place)",
                        flush=True,
                    )
                costs = await bench.rebuild_costs(turn)
                costs["ballast_kb"] = ballast
                report["rebuild"].append(costs)
                print(
                    f"workspace {ballast // 1024} MB: turn snapshot {costs['snapshot_bytes'] / 1e6:.2f} MB in "
                    f"{costs['snapshot_s_per_turn']} s per turn ({costs['snapshots']} taken; rollout "
                    f"{costs['rollout_wall_s']['without']} s without, {costs['rollout_wall_s']['with_turn_snapshots']} s "
                    f"with) | fork from the snapshot: {costs['restore_s']} s | fork by replay of "
                    f"{costs['replayed_calls']} calls: {costs['replay_s']} s",
                    flush=True,
                )
    print(json.dumps(report))


if __name__ == "__main__":
    asyncio.run(main())
