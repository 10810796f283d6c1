"""A sandbox that cannot start commands fails the rollout as machinery (`sandbox_error`), never as a 0.

In a 1,000-rollout batch, two rollouts had every command, the verifier's included, fail with
`setpriv: failed to execute bash: Resource temporarily unavailable` (their slot's uid had run out
of processes through another container's slots); they were verified, scored 0 and written into
the training data like a model that failed its task. Here the slot's uid is filled to its process
limit from outside the agent's reach, and the rollout must stop with `sandbox_error`, be held
back (`groups_pending`), and leave the group file empty.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput, BatchResult
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.temporal import connect
from temporal_rollouts.sandbox.requests import HealthQuery
from temporal_rollouts.sandbox_server.config import SlotLimits
from tests.support.sandbox import needs_bubblewrap
from workflows.batch import BatchWorkflow

pytestmark = [
    needs_bubblewrap,
    pytest.mark.skipif(os.geteuid() != 0, reason="slots have uids of their own only as root"),
]

MAX_PROCESSES = 12


async def test_a_slot_that_cannot_fork_fails_the_rollout_and_no_zero_is_written(
    settings: Settings, parts, demo_policy, tmp_path: Path
) -> None:
    from temporal_rollouts.runtime.worker import Parts, polling_worker

    own = settings.model_copy(
        update={
            "data_dir": tmp_path / "data",
            "temporal": settings.temporal.model_copy(update={"task_queue": f"no-fork-{uuid.uuid4().hex[:6]}"}),
            "sandbox": settings.sandbox.model_copy(
                update={
                    "use_cgroups": False,
                    "limits": SlotLimits(max_processes=MAX_PROCESSES),
                    "slots_per_container": 1,
                    "min_containers": 1,
                    "max_containers": 1,
                }
            ),
        }
    )
    own_parts = Parts(own)
    hogs: list[subprocess.Popen[bytes]] = []
    try:
        (container,) = await own_parts.pool.fleet.ensure_running()
        health = await own_parts.pool.fleet.send(container.container_id, HealthQuery())
        uid = health.slot_uids[0]
        setpriv = shutil.which("setpriv")
        assert setpriv
        hogs = [
            subprocess.Popen([setpriv, "--reuid", str(uid), "--regid", str(uid), "--clear-groups", "sleep", "300"])
            for _ in range(MAX_PROCESSES + 2)
        ]
        client: Client = await connect(own, objects=parts.objects, start_embedded=False)
        async with polling_worker(client, own_parts):
            result = BatchResult.model_validate(
                await client.execute_workflow(
                    BatchWorkflow.run,
                    BatchInput(env="echo_chain", num_items=1, group_size=1, env_config={"steps": 1}),
                    id=f"no-fork-{uuid.uuid4().hex[:6]}",
                    task_queue=own.temporal.task_queue,
                )
            )
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
        await own_parts.aclose()
        await own_parts.pool.fleet.backend.shutdown()
    assert (result.completed, result.failed) == (0, 1)
    assert result.stop_reasons == {"sandbox_error": 1}
    assert (result.groups_written, result.groups_pending) == (0, 1)
    output = Path(result.output)
    assert not output.exists() or output.read_text() == "", "a sandbox failure was written as training data"
