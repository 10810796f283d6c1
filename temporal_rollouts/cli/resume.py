"""`rollouts resume`: continue a failed rollout, or every failed rollout of a batch, where it stopped
(the work is client/resume.py's; this says what it did)."""

from __future__ import annotations

import argparse
import json

from rich.console import Console

from temporal_rollouts.cli.progress import finish
from temporal_rollouts.client.connection import command_client
from temporal_rollouts.client.resume import failed_rollouts, resumable, resume_batch, resume_rollout
from temporal_rollouts.core.settings import Settings


async def cmd_resume(args: argparse.Namespace, settings: Settings) -> int:
    """Resume a failed rollout, or every failed rollout of a batch and gather its groups again."""
    console = Console(stderr=args.json)
    client = await command_client(settings)
    described = await resumable(client, args.id)
    if described.workflow_type == "TrajectoryWorkflow":
        resumed = await resume_rollout(client, settings, args.id)
        if args.json:
            print(json.dumps(resumed))
        else:
            console.print(
                f"resumed {resumed['rollout_id']} from run {resumed['resumed_from_run']} as run {resumed['run_id']}"
            )
        return 0
    failed = await failed_rollouts(client, args.id)
    new, original = await resume_batch(client, settings, described)
    if not args.json:
        console.print(f"resuming {len(failed)} rollout(s) of {args.id}: " + (", ".join(failed) or "none"))
        console.print(f"the batch gathers its groups again as run {new.result_run_id}")
    if not args.wait:
        if args.json:
            print(json.dumps({"batch_id": args.id, "run_id": new.result_run_id, "resumed": failed}))
        return 0
    return await finish(
        client, new, console, settings, as_json=args.json, extra={"resumed": failed}, policy=original.policy
    )
