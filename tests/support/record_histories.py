"""Record the histories that tests/unit/test_history_replay.py replays: `python -m tests.support.record_histories`.

Each is a real run through the real dev server, sandbox, demo policy and a worker built as
`python worker.py` builds it: a terminal-task rollout, an echo_chain batch and one of its
rollouts, and a branched batch's tree, its parent and one branch. Re-record them when a
change to the workflow code is meant to break replay, which worker versioning
(docs/upgrades.md) makes safe: runs in flight finish on the build they started on.
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from envs.registry import get_env
from temporal_rollouts.core import search_attributes
from temporal_rollouts.core.records import BatchInput, TrajectoryInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import FAST_STEP_FLAGS, connect, temporal_binary
from temporal_rollouts.sandbox.backends.local import LocalBackend
from tests.support import REPO
from tests.support.processes import kill_servers_under
from tests.support.servers.demo_policy import DemoPolicyProcess
from temporal_rollouts.runtime.worker import Parts, polling_worker
from workflows.batch import BatchWorkflow
from workflows.trajectory import TrajectoryWorkflow

HISTORIES = REPO / "tests" / "data" / "histories"
QUEUE = "rollouts-record"


async def record(client: Client) -> dict[str, str]:
    """Run each workflow to its end; the JSON history of each recorded id, by fixture name."""
    item = next(i for i in get_env("terminal_tasks").load_items(20) if i.id == "write-fizzbuzz")
    await client.execute_workflow(
        TrajectoryWorkflow.run,
        TrajectoryInput(env="terminal_tasks", item=item),
        id="rollout-recorded",
        task_queue=QUEUE,
    )
    batch = BatchInput(env="echo_chain", env_config={"steps": 2}, num_items=1, group_size=2)
    await client.execute_workflow(BatchWorkflow.run, batch, id="batch-recorded", task_queue=QUEUE)
    forked = BatchInput(
        env="echo_chain", env_config={"steps": 3}, num_items=1, group_size=1, branch={"at_turns": [1], "factor": 2}
    )
    await client.execute_workflow(BatchWorkflow.run, forked, id="fork-recorded", task_queue=QUEUE)
    ids = {
        "trajectory": "rollout-recorded",
        "batch": "batch-recorded",
        "batch_child": "batch-recorded/item-0/g0",
        "fork_tree": "fork-recorded/item-0/tree",
        "fork_parent": "fork-recorded/item-0/g0",
        "fork_branch": "fork-recorded/item-0/g0/t1b1",
    }
    return {name: (await client.get_workflow_handle(wid).fetch_history()).to_json() for name, wid in ids.items()}


async def main() -> int:
    with tempfile.TemporaryDirectory(prefix="record-histories-") as scratch:
        root = Path(scratch)
        env = await WorkflowEnvironment.start_local(
            dev_server_existing_path=temporal_binary(),
            dev_server_extra_args=FAST_STEP_FLAGS,
            search_attributes=search_attributes.ALL,
            data_converter=pydantic_data_converter,
        )
        policy = DemoPolicyProcess(root / "demo_policy.log")
        policy.start()
        settings = Settings(
            data_dir=root / "rollouts",
            temporal={"address": env.client.service_client.config.target_host, "task_queue": QUEUE},
            demo_policy={"port": policy.port, "start_local": False},
            sandbox={"slots_per_container": 4},
        )
        parts = Parts(settings)
        try:
            await parts.pool.fleet.ensure_running()
            client = await connect(settings, objects=parts.objects, start_embedded=False)
            async with polling_worker(client, parts):
                histories = await record(client)
        finally:
            await parts.aclose()
            backend = LocalBackend.from_settings(settings)
            for container in await backend.list_containers():
                await backend.stop_container(container.container_id)
            kill_servers_under(settings.data_dir)
            policy.stop()
            await env.shutdown()
    for name, text in histories.items():
        (HISTORIES / f"{name}.json").write_text(text + "\n")
        print(f"recorded {HISTORIES / name}.json")
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
