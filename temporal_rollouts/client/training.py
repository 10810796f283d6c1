"""Training runs: start one, read its figures and how it ended, list them, stop one.

A run is a `TrainingFeedWorkflow` whose id is the run's name. It lives in Temporal, not in whoever
started it: a run whose name is already running is refused (attach to it instead), and stopping
drains it (no new groups; those in flight finish and are posted) unless told to cancel them now.
`rollouts train` and the Atropos env's `serve` both start and read runs through here.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from temporal_rollouts.client.records import (
    QUERY_TIMEOUT,
    RETRIES_SAMPLED,
    pending_notes,
    require_workflow,
    retry_summary,
    root_cause,
    status_name,
    waiting_on_retries,
)
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.feed import FeedInput, FeedStatus
from temporal_rollouts.core.settings import ChatPolicy, Settings

FEED = "TrainingFeedWorkflow"


def check_start(feed: FeedInput, settings: Settings) -> None:
    """What the run's own first step checks of its policy, checked here too so a mistake is one line, not a
    failed run."""
    endpoint = settings.policy_endpoint(feed.policy)
    if isinstance(endpoint, ChatPolicy) and not (endpoint.tokenizer or feed.tokenizer):
        name = feed.policy or settings.default_policy
        raise ConfigError(
            f"policy {name!r} gives no token ids: a training run needs a token-level policy (sglang, vllm) "
            f"or a chat policy with a tokenizer (policies.{name}.tokenizer, or --tokenizer)"
        )


async def start_feed(client: Client, settings: Settings, name: str, feed: FeedInput) -> WorkflowHandle:
    """Start the run `name`; a ConfigError when one of that name is already running."""
    from workflows.feed import TrainingFeedWorkflow

    try:
        return await client.start_workflow(
            TrainingFeedWorkflow.run,
            feed,
            id=name,
            task_queue=settings.temporal.task_queue,
            search_attributes=TypedSearchAttributes([SearchAttributePair(sa.ENV, feed.env)]),
        )
    except WorkflowAlreadyStartedError:
        raise ConfigError(
            f"a training run named {name!r} is running: watch it with `rollouts train status {name}`, "
            f"or stop it with `rollouts train stop {name}`"
        ) from None


class RunReport(FeedStatus):
    """`rollouts train status`: the run's figures, what became of it, and what fails while it runs."""

    outcome: str = Field(description="running, completed, or stopped (ended by `rollouts train stop`).")
    retrying: list[str] = Field(
        default_factory=list,
        description="While it runs: the steps that failed and wait for a retry (its rollouts' and its own), "
        "one line per cause, with the last error and the attempt.",
    )


def run_outcome(status: str, final: FeedStatus | None) -> str:
    """What became of a run, one definition for `train status`, `train list` and the web page: a run
    that ended because it was told to stop (`train stop`, `--now` or not) is `stopped`, never `completed`."""
    if status == "completed" and final is not None and final.stopping:
        return "stopped"
    return status


async def run_retries(client: Client, name: str, description: Any, sample: int = 50) -> list[str]:
    """One line per cause of the retries of a running run: its own steps (registering with run-api,
    posting) and its rollouts' (a model that cannot be reached, a template that cannot render)."""
    own = [f"the run's {note.activity}: {note.headline}" for note in pending_notes(name, description)]
    return own + retry_summary(await waiting_on_retries(client, name, sample))


async def feed_status(client: Client, name: str) -> RunReport:
    """The run's figures; a run that failed, or was terminated, is an error naming why. A finished run's
    come from its result (no worker needs to answer); a running one's from its `status` query."""
    described = await require_workflow(client, name, FEED)
    handle = client.get_workflow_handle(name)
    if described.status == WorkflowExecutionStatus.COMPLETED:
        final = FeedStatus.model_validate(await handle.result())
        return RunReport(**dict(final), outcome=run_outcome("completed", final))
    if described.status != WorkflowExecutionStatus.RUNNING:
        state = described.status.name.lower() if described.status else "gone"
        try:
            await handle.result()
        except WorkflowFailureError as err:
            raise ConfigError(f"training run {name} {state}: {root_cause(err)}") from None
        raise ConfigError(f"training run {name} {state}")
    status = FeedStatus.model_validate(await handle.query("status", rpc_timeout=QUERY_TIMEOUT))
    retrying = await run_retries(client, name, described.raw_description)
    return RunReport(**dict(status), outcome="running", retrying=retrying)


async def stop_run(client: Client, name: str, *, now: bool = False) -> None:
    """Tell a running run to stop: drain (no new groups; those in flight finish and are posted), or with
    `now`, cancel the rollouts in flight. A run that is not running is a ConfigError saying how it ended."""
    described = await require_workflow(client, name, FEED)
    if described.status != WorkflowExecutionStatus.RUNNING:
        state = status_name(described.status)
        if described.status == WorkflowExecutionStatus.COMPLETED:  # completed, or stopped before
            state = (await feed_status(client, name)).outcome
        raise ConfigError(f"training run {name} is not running (it is {state})")
    await client.get_workflow_handle(name).signal("stop_now" if now else "stop")


class RunSummary(BaseModel):
    """One training run in `rollouts train list` and on the web page."""

    run: str
    status: str
    outcome: str = Field(description="running, completed, stopped (by `rollouts train stop`), failed, ...")
    env: str | None = None
    started_at: datetime | None = None
    groups_posted: int | None = None
    in_flight: int | None = None
    retrying: list[str] = Field(default_factory=list, description="While it runs: what fails and waits for a retry.")


async def list_training_runs(
    client: Client, limit: int = 50, finals: dict[str, FeedStatus | None] | None = None
) -> list[RunSummary]:
    """Training runs, newest first; a running one with its posted and in-flight groups and what it retries,
    a finished one with what it posted and how it ended. `finals` keeps finished runs' results (by run id)."""
    finals = {} if finals is None else finals
    runs: list[RunSummary] = []
    seen: set[str] = set()
    async for execution in client.list_workflows(f"WorkflowType = '{FEED}'"):
        if execution.id in seen:  # an earlier run of one that continued as new
            continue
        seen.add(execution.id)
        status = status_name(execution.status)
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        figures: FeedStatus | None = None
        retrying: list[str] = []
        try:
            if execution.status == WorkflowExecutionStatus.RUNNING:
                figures = FeedStatus.model_validate(await handle.query("status", rpc_timeout=QUERY_TIMEOUT))
                described = await handle.describe()
                retrying = await run_retries(client, execution.id, described.raw_description, RETRIES_SAMPLED)
            elif execution.status == WorkflowExecutionStatus.COMPLETED:
                if execution.run_id not in finals:
                    finals[execution.run_id] = FeedStatus.model_validate(await handle.result(follow_runs=False))
                figures = finals[execution.run_id]
        except RPCError:
            pass
        runs.append(
            RunSummary(
                run=execution.id,
                status=status,
                outcome=run_outcome(status, figures),
                env=execution.typed_search_attributes.get(sa.ENV),
                started_at=execution.start_time,
                groups_posted=figures.figures.groups_posted if figures else None,
                in_flight=figures.in_flight
                if figures and execution.status == WorkflowExecutionStatus.RUNNING
                else None,
                retrying=retrying,
            )
        )
        if len(runs) >= limit:
            break
    return runs
