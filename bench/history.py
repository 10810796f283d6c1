"""History bytes per turn: references (what TrajectoryWorkflow does) against the naive design.

Runs `echo_chain` rollouts of 10, 50 and 100 turns with small tool outputs and with
~2,000-token (8,000-character) ones, through a real worker, sandbox, demo policy and
Temporal dev server, and measures each rollout's whole history (the serialized events).

The naive figure is computed, not run (a naive 100-turn rollout with large outputs would
pass the server's 50 MB history limit): it is the measured history plus, for every model
turn, the conversation so far serialized as that turn's input, which is what passing the
whole conversation to each model-turn activity adds.

    python bench/history.py            # 10, 50, 100 turns x small, large
    python bench/history.py --quick    # 10, 50 turns
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.procs import services  # noqa: E402
from temporal_rollouts.core.records import RolloutLimits, TrajectoryInput, TrajectoryResult  # noqa: E402
from temporal_rollouts.core.tasks import Item  # noqa: E402
from temporal_rollouts.runtime.temporal import connect  # noqa: E402
from temporal_rollouts.storage.objects import object_client  # noqa: E402
from temporal_rollouts.storage.transcripts import TranscriptStore  # noqa: E402
from workflows.trajectory import TrajectoryWorkflow  # noqa: E402

SIZES = {"small": 0, "large": 8000}


async def measure(turns: int, output_chars: int, stack, client, transcripts: TranscriptStore) -> dict:
    steps = turns - 1  # N echo steps make N+1 model turns
    result = TrajectoryResult.model_validate(
        await client.execute_workflow(
            TrajectoryWorkflow.run,
            TrajectoryInput(
                env="echo_chain",
                item=Item(id=f"echo-{uuid.uuid4().int % 10**6}"),
                env_config={"steps": steps, "output_chars": output_chars},
                limits=RolloutLimits(max_turns=turns, max_tool_calls=turns, context_tokens=10**8),
            ),
            id=f"history-{uuid.uuid4().hex[:8]}",
            task_queue=stack.settings.temporal.task_queue,
        )
    )
    history = await client.get_workflow_handle(result.rollout_id).fetch_history()
    ours = sum(event.ByteSize() for event in history.events)
    messages = await transcripts.load(result.transcript)
    conversation_bytes = 0
    naive_extra = 0
    for message in messages:
        if message.role == "assistant":
            naive_extra += conversation_bytes
        conversation_bytes += len(message.model_dump_json(exclude_none=True))
    return {
        "turns": result.turns,
        "events": len(history.events),
        "ours": ours,
        "naive": ours + naive_extra,
        "context_bytes": conversation_bytes,
        "score": result.score,
    }


async def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--turns", type=int, nargs="+", default=None)
    args = parser.parse_args(argv)
    lengths = args.turns or ([10, 50] if args.quick else [10, 50, 100])
    with tempfile.TemporaryDirectory(prefix="rollouts-bench-history-") as tmp:
        async with services(Path(tmp), slots=4, worker="process", db_file=False) as stack:
            client = await connect(stack.settings, start_embedded=False)
            transcripts = TranscriptStore(object_client(stack.settings), stack.settings.storage.bucket)
            print(
                f"{'turns':>5} {'outputs':>7} {'context KB':>10} {'events':>6} {'ours KB':>8} "
                f"{'ours B/turn':>11} {'naive KB':>9} {'naive B/turn':>12}"
            )
            rows = []
            for turns in lengths:
                for label, chars in SIZES.items():
                    row = await measure(turns, chars, stack, client, transcripts)
                    assert row["score"] == 1.0, row
                    rows.append(
                        {
                            "turns": row["turns"],
                            "outputs": label,
                            "ours_bytes_per_turn": round(row["ours"] / row["turns"]),
                            "naive_bytes_per_turn": round(row["naive"] / row["turns"]),
                        }
                    )
                    print(
                        f"{row['turns']:>5} {label:>7} {row['context_bytes'] / 1024:>10.1f} {row['events']:>6} "
                        f"{row['ours'] / 1024:>8.1f} {row['ours'] / row['turns']:>11.0f} "
                        f"{row['naive'] / 1024:>9.1f} {row['naive'] / row['turns']:>12.0f}"
                    )
    print(json.dumps({"rows": rows}))


if __name__ == "__main__":
    asyncio.run(main())
