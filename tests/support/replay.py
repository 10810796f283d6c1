"""Replaying a real history under the sandboxed workflow runner."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.worker import Replayer
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from temporal_rollouts.runtime.worker import WORKFLOWS


async def sandboxed_replay_failure(client: Client, workflow_id: str) -> Exception | None:
    """Workers run workflow code unsandboxed (worker.sandboxed_workflows is off); replaying a workflow's
    history under the sandboxed runner catches a non-deterministic call or a restricted import that a
    change let into workflow code. None when it replays."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    replayer = Replayer(
        workflows=WORKFLOWS, workflow_runner=SandboxedWorkflowRunner(), data_converter=client.data_converter
    )
    return (await replayer.replay_workflow(history, raise_on_replay_failure=False)).replay_failure
