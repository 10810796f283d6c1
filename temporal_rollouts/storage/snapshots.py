"""Where a rollout's workspace is saved when it fails (or when the reaper frees its slot),
so that a resumed rollout continues with the files it had built instead of redoing commands."""

from __future__ import annotations

PREFIX = "snapshots"


def snapshot_key(workflow_id: str, run_id: str) -> str:
    """One snapshot per rollout run; the same key whether the workflow or the reaper took it."""
    return f"{PREFIX}/{workflow_id}/{run_id}.tar.gz"
