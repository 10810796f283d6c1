"""Upgrading workers with batches in flight (worker versioning, docs/upgrades.md): a new build takes the
new batches while the old build finishes its own, a long-lived workflow moves to the new build by
continuing as new, and an old worker that restarts takes nothing back.
Real dev server, workers, sandbox and demo policy."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path

from temporalio.client import Client, WorkflowExecutionStatus

from temporal_rollouts.cli.main import main as cli_main
from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime import versioning
from temporal_rollouts.runtime.schedules import ensure_maintenance_workflow
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.sandbox.backends.local import LocalBackend
from tests.support.processes import kill_servers_under
from tests.support.servers.demo_policy import DemoPolicyProcess
from tests.support.waiting import wait_until
from temporal_rollouts.runtime.worker import Parts, polling_worker
from workflows.batch import BatchWorkflow


def _build(settings: Settings, queue: str, data_dir: Path, build_id: str) -> Settings:
    return settings.model_copy(
        update={
            "data_dir": data_dir,
            "temporal": settings.temporal.model_copy(update={"task_queue": queue}),
            "worker": settings.worker.model_copy(update={"build_id": build_id}),
        }
    )


async def _pinned_build(client: Client, workflow_id: str) -> str:
    described = await client.get_workflow_handle(workflow_id).describe()
    return described.raw_description.workflow_execution_info.versioning_info.deployment_version.build_id


async def _on_build(client: Client, workflow_id: str, build: str) -> bool:
    """The workflow's latest run is running on `build`."""
    described = await client.get_workflow_handle(workflow_id).describe()
    return described.status == WorkflowExecutionStatus.RUNNING and await _pinned_build(client, workflow_id) == build


async def _rollout_ids(client: Client, batch_id: str) -> list[str]:
    return [
        e.id
        async for e in client.list_workflows(f"RolloutBatchId = '{batch_id}' AND WorkflowType = 'TrajectoryWorkflow'")
    ]


async def test_a_new_build_takes_new_batches_while_the_old_build_finishes_its_own(
    settings: Settings, parts: Parts, demo_policy: DemoPolicyProcess, tmp_path: Path, monkeypatch, capsys
) -> None:
    queue = f"upgrade-{uuid.uuid4().hex[:6]}"
    old = _build(settings, queue, tmp_path / "data", "build-1")
    new = _build(settings, queue, tmp_path / "data", "build-2")
    old_parts, new_parts = Parts(old), Parts(new)
    quick_upkeep = old.model_copy(update={"sandbox": old.sandbox.model_copy(update={"reap_interval_s": 0.5})})
    batch = BatchInput(env="echo_chain", num_items=2, group_size=2, env_config={"steps": 3})
    client = await connect(old, objects=parts.objects, start_embedded=False)
    try:
        demo_policy.control(delay_s=1.0)  # every turn takes a second, so the first batch is mid-way when build 2 comes
        async with polling_worker(client, old_parts):
            assert (await versioning.describe(client, old)).current == "build-1"
            first = await client.start_workflow(BatchWorkflow.run, batch, id=f"{queue}-first", task_queue=queue)
            upkeep = await ensure_maintenance_workflow(client, quick_upkeep)  # long-lived: moves at continue-as-new
            await wait_until(lambda: _rollout_ids(client, first.id), timeout_s=30)

            async with polling_worker(client, new_parts):
                deployment = await versioning.describe(client, new)
                assert deployment.current == "build-2" and {b.build_id for b in deployment.builds} == {
                    "build-1",
                    "build-2",
                }
                assert (await first.describe()).status == WorkflowExecutionStatus.RUNNING  # upgraded mid-batch
                assert {b.build_id: b.status for b in deployment.builds}["build-1"] == "draining"
                second = await client.start_workflow(BatchWorkflow.run, batch, id=f"{queue}-second", task_queue=queue)
                demo_policy.control(delay_s=0.0)
                results = [BatchResult.model_validate(await h.result()) for h in (first, second)]
                assert await wait_until(lambda: _on_build(client, upkeep.id, "build-2"), timeout_s=30)
                await upkeep.terminate("test over")

            for result in results:
                assert result.total == 4 and result.completed == 4 and result.failed == 0, result
            for handle, build in ((first, "build-1"), (second, "build-2")):
                rollouts = await _rollout_ids(client, handle.id)
                assert len(rollouts) == 4
                assert {await _pinned_build(client, r) for r in [handle.id, *rollouts]} == {build}

        async with polling_worker(client, old_parts):  # an old worker restarting takes no new work back
            assert (await versioning.describe(client, old)).current == "build-2"

        # By hand, as fleets with worker.become_current = "never" do: `rollouts versions --set-current`.
        monkeypatch.setenv("ROLLOUTS_TEMPORAL__ADDRESS", old.temporal.address)
        monkeypatch.setenv("ROLLOUTS_TEMPORAL__TASK_QUEUE", queue)
        assert await asyncio.to_thread(cli_main, ["versions", "--set-current", "build-1", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["current"] == "build-1" and {b["build_id"] for b in shown["builds"]} == {"build-1", "build-2"}
    finally:
        demo_policy.reset()
        await old_parts.aclose()
        await new_parts.aclose()
        backend = LocalBackend.from_settings(old)
        for container in await backend.list_containers():
            await backend.stop_container(container.container_id)
        kill_servers_under(old.data_dir)
