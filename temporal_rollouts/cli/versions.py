"""`rollouts versions`: the builds of the worker deployment, which one takes new work, and which are
drained (docs/upgrades.md). `--set-current BUILD` moves new work to a build by hand, for fleets that
run with `worker.become_current = "never"`."""

from __future__ import annotations

import argparse
import json

from rich.console import Console
from rich.table import Table

from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime import versioning
from temporal_rollouts.runtime.temporal import connect


async def cmd_versions(args: argparse.Namespace, settings: Settings) -> int:
    client = await connect(settings, start_embedded=False)
    if args.set_current:
        await versioning.set_current(client, settings, args.set_current)
    deployment = await versioning.describe(client, settings)
    builds = deployment.builds if deployment else []
    if args.json:
        print(
            json.dumps(
                {
                    "deployment": versioning.deployment_name(settings),
                    "current": deployment.current if deployment else None,
                    "builds": [
                        {
                            "build_id": b.build_id,
                            "status": b.status,
                            "created": b.created.isoformat() if b.created else None,
                        }
                        for b in builds
                    ],
                }
            )
        )
        return 0
    console = Console()
    if not builds:
        console.print(
            f"no versioned worker has polled task queue {settings.temporal.task_queue!r} yet "
            "(workers with worker.versioning = false do not show here)"
        )
        return 0
    table = Table("build", "status", "created")
    for build in builds:
        table.add_row(build.build_id, build.status, f"{build.created:%Y-%m-%d %H:%M:%S}" if build.created else "")
    console.print(table)
    console.print("stop an old build's workers once it shows drained: nothing is pinned to it any more")
    return 0
