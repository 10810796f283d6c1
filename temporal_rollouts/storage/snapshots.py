"""Where a rollout's workspace is saved when it fails (or when the reaper frees its slot),
so that a resumed rollout continues with the files it had built instead of redoing commands;
and after a turn (`snapshot_turns`, or a branch point), so that a fork from that turn
restores it instead of replaying the tool calls."""

from __future__ import annotations

PREFIX = "snapshots"


def snapshot_key(workflow_id: str, run_id: str) -> str:
    """One snapshot per rollout run; the same key whether the workflow or the reaper took it."""
    return f"{PREFIX}/{workflow_id}/{run_id}.tar.gz"


def turn_snapshot_key(workflow_id: str, transcript_head: str) -> str:
    """The workspace of a rollout after a turn, named by the transcript head at that turn: what a fork
    from that very state restores, whichever run of the rollout took it."""
    return f"{PREFIX}/{workflow_id}/turns/{transcript_head}.tar.gz"
