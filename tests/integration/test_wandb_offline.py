"""With Weights & Biases on, the Atropos env logs what the system we replace logged: a
rollout table of conversations (reasoning cut to 300 characters, tool arguments to 200,
tool results to 500) and the tool-error count and details. Run through atroposlib's own
`wandb_log` into W&B's offline mode, and read back from the offline run's files."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

wandb = pytest.importorskip("wandb")
pytest.importorskip("atroposlib")

from temporal_rollouts.integrations.atropos.env import TemporalRolloutsEnv  # noqa: E402
from tests.support.waiting import wait_until  # noqa: E402

pytestmark = pytest.mark.slow


def _records(path: Path) -> list[bytes]:
    """The records of a `.wandb` transaction log: LevelDB's log format (32 KiB blocks of
    checksum, length, type chunks) after a 7-byte W&B header, as wandb's own reader parses it."""
    data, records, pending, offset = path.read_bytes(), [], b"", 7
    block = 32 * 1024
    while offset + 7 <= len(data):
        if block - offset % block < 7:  # a block's tail too short for a header is padding
            offset += block - offset % block
            continue
        length, kind = struct.unpack("<HB", data[offset + 4 : offset + 7])
        chunk = data[offset + 7 : offset + 7 + length]
        offset += 7 + length
        if kind == 0 and length == 0:
            break
        pending = chunk if kind in (1, 2) else pending + chunk
        if kind in (1, 4):
            records.append(pending)
    return records


async def _grown(log: Path) -> bool:
    return log.stat().st_size > 7  # more than the W&B header


def _history(run_dir: Path) -> list[dict]:
    """The logged rows, read from the offline run's transaction log."""
    from wandb.proto import wandb_internal_pb2

    rows = []
    for data in _records(next(run_dir.glob("*.wandb"))):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        if record.WhichOneof("record_type") == "history":
            rows.append(
                {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            )
    return rows


async def test_rollout_table_and_tool_errors_reach_wandb(
    tmp_path: Path, monkeypatch, smollm2_tokenizer_dir: Path
) -> None:
    tokenizer = smollm2_tokenizer_dir
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    config, servers = TemporalRolloutsEnv.config_init()
    config = config.model_copy(
        update={
            "tokenizer_name": str(tokenizer),
            "use_wandb": True,
            "group_size": 2,
            "num_rollouts_per_group_for_logging": -1,
        }
    )
    env = TemporalRolloutsEnv(config, servers, slurm=False, testing=False)
    env.tool_error_buffer = [
        {"turn": 1, "tool_name": "terminal", "arguments": '{"command": "' + "x" * 400 + '"}', "error": "timed out"}
    ]
    long_result, long_reasoning = "r" * 2000, "thinking " * 100
    group = {
        "scores": [1.0, 0.0],
        "messages": [
            [
                {"role": "user", "content": "make docs"},
                {
                    "role": "assistant",
                    "reasoning_content": long_reasoning,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "terminal", "arguments": '{"command": "' + "y" * 300 + '"}'},
                        }
                    ],
                },
                {"role": "tool", "tool_call_id": "c1", "content": long_result},
                {"role": "assistant", "content": "done"},
            ],
            [{"role": "user", "content": "make docs"}, {"role": "assistant", "content": "I give up"}],
        ],
    }
    run = wandb.init(project="temporal-rollouts-test", dir=str(tmp_path), mode="offline")
    await env.add_rollouts_for_wandb(group)
    await env.wandb_log({})
    run_dir = Path(run.dir).parent
    wandb.finish()
    wandb.teardown()  # stops wandb-core, which writes out the transaction log
    log = next(run_dir.glob("*.wandb"))
    await wait_until(lambda: _grown(log), timeout_s=30)

    files = sorted(str(f.relative_to(run_dir)) for f in run_dir.rglob("*") if f.is_file())
    rows = _history(run_dir)
    assert len(rows) == 1, (rows, files, [f.stat().st_size for f in run_dir.glob("*.wandb")])
    [row] = rows
    assert row["train/tool_errors_count"] == 1
    assert (
        row["train/tool_error_details"].startswith("[turn 1] terminal(")
        and "timed out" in row["train/tool_error_details"]
    )
    [table_file] = run_dir.glob("files/media/table/train/rollouts_*.table.json")
    table = json.loads(table_file.read_text())
    assert table["columns"] == ["text", "score"]
    (first, first_score), (second, second_score) = table["data"]
    assert (first_score, second_score) == (1.0, 0.0)
    assert "[tool call] terminal(" in first and "[tool result] " + "r" * 500 + "... [1500 more]" in first
    assert "[assistant reasoning] " + long_reasoning[:300] + "..." in first
    [call_line] = [line for line in first.splitlines() if line.startswith("[tool call]")]
    assert call_line.count("y") == 200 - len('{"command": "') and call_line.endswith("... [115 more])")
    assert "[assistant] I give up" in second
