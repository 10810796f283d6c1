"""Temporal worker versioning: a rollout finishes on the build of the workflow code it started on.

Every worker belongs to one Worker Deployment (named after its task queue) and serves one build of
it. Every workflow is pinned (`VersioningBehavior.PINNED`, the worker's default): its workflow
tasks, activities and child rollouts go only to workers of the build it started on, so a change to
the workflow code never meets a history it cannot replay. The training feed and the pool's
maintenance workflow live for days: they continue as new onto the current build once a newer one
is current (workflows/upgrades.py).

Upgrading is starting workers of the new build: a starting worker makes its build the deployment's
current one when no newer build has polled yet (`worker.become_current`), so new batches go to it,
and the old workers finish what is pinned to them. docs/upgrades.md says how to tell when an old
build is drained and may be stopped.

The default build id is a digest of the code that decides what a workflow does (`workflows/` and
the shared models in `temporal_rollouts/core/`), read as syntax trees without docstrings: restarting
workers after a change to an activity, an env or a setting keeps their build, so their rollouts
carry on as before; a change to a workflow's logic makes a new build.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import hashlib
import logging
import random
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from temporalio.api.enums.v1 import VersionDrainageStatus, WorkerDeploymentVersionStatus
from temporalio.api.workflowservice.v1 import (
    DescribeWorkerDeploymentRequest,
    SetWorkerDeploymentCurrentVersionRequest,
)
from temporalio.client import Client
from temporalio.common import VersioningBehavior, WorkerDeploymentVersion
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import WorkerDeploymentConfig

from temporal_rollouts.core.settings import Settings

log = logging.getLogger("temporal_rollouts.versioning")

ROOT = Path(__file__).resolve().parents[2]
WORKFLOW_CODE = (ROOT / "workflows", ROOT / "temporal_rollouts" / "core")
"""The code whose change makes a new build: the workflows and the models they decide with."""


@functools.cache
def workflow_code_digest() -> str:
    """A short digest of the workflow code's syntax, docstrings and comments aside."""
    digest = hashlib.sha256()
    for folder in WORKFLOW_CODE:
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(ROOT)).encode())
            digest.update(_code_only(path.read_text(encoding="utf-8")).encode())
    return digest.hexdigest()[:16]


def _code_only(source: str) -> str:
    tree = ast.parse(source)
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(body, list)
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)
        ):
            body[0] = ast.Pass()
    return ast.dump(tree, include_attributes=False)


def deployment_name(settings: Settings) -> str:
    """One deployment per task queue: the workers that may take each other's rollouts."""
    return settings.temporal.task_queue


def worker_version(settings: Settings) -> WorkerDeploymentVersion:
    return WorkerDeploymentVersion(
        deployment_name=deployment_name(settings), build_id=settings.worker.build_id or workflow_code_digest()
    )


def deployment_config(settings: Settings) -> WorkerDeploymentConfig | None:
    """The Worker's `deployment_config`; None with versioning off."""
    if not settings.worker.versioning:
        return None
    return WorkerDeploymentConfig(
        version=worker_version(settings),
        use_worker_versioning=True,
        default_versioning_behavior=VersioningBehavior.PINNED,
    )


@dataclass(frozen=True)
class BuildState:
    """One build of the deployment, as `rollouts versions` shows it."""

    build_id: str
    status: str
    """current, ramping, draining (pinned work still open), drained, inactive or created."""
    created: datetime | None
    current_since: datetime | None


@dataclass(frozen=True)
class Deployment:
    name: str
    current: str | None
    builds: list[BuildState]
    conflict_token: bytes


async def describe(client: Client, settings: Settings) -> Deployment | None:
    """The deployment's builds, newest first; None before any versioned worker polled."""
    name = deployment_name(settings)
    try:
        reply = await client.workflow_service.describe_worker_deployment(
            DescribeWorkerDeploymentRequest(namespace=settings.temporal.namespace, deployment_name=name)
        )
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    info = reply.worker_deployment_info
    current = info.routing_config.current_deployment_version.build_id or None
    builds = [
        BuildState(
            build_id=summary.deployment_version.build_id,
            status=_status(summary.status, summary.drainage_status),
            created=summary.create_time.ToDatetime() if summary.HasField("create_time") else None,
            current_since=summary.current_since_time.ToDatetime() if summary.HasField("current_since_time") else None,
        )
        for summary in info.version_summaries
    ]
    builds.sort(key=lambda build: build.created or datetime.min, reverse=True)
    return Deployment(name=name, current=current, builds=builds, conflict_token=reply.conflict_token)


def _status(status: int, drainage: int) -> str:
    if status == WorkerDeploymentVersionStatus.WORKER_DEPLOYMENT_VERSION_STATUS_UNSPECIFIED:
        return "drained" if drainage == VersionDrainageStatus.VERSION_DRAINAGE_STATUS_DRAINED else "draining"
    return WorkerDeploymentVersionStatus.Name(status).removeprefix("WORKER_DEPLOYMENT_VERSION_STATUS_").lower()


async def set_current(client: Client, settings: Settings, build_id: str, conflict_token: bytes = b"") -> None:
    await client.workflow_service.set_worker_deployment_current_version(
        SetWorkerDeploymentCurrentVersionRequest(
            namespace=settings.temporal.namespace,
            deployment_name=deployment_name(settings),
            build_id=build_id,
            conflict_token=conflict_token,
            identity=client.identity,
        )
    )


# The server answers RESOURCE_EXHAUSTED ("too many requests issued to Worker Deployment") when
# several workers of a fleet start together; RACED are the answers of a lost race or a first poll
# not yet registered. Both mean: look again a little later.
_LOOK_AGAIN = (
    RPCStatusCode.RESOURCE_EXHAUSTED,
    RPCStatusCode.FAILED_PRECONDITION,
    RPCStatusCode.ABORTED,
    RPCStatusCode.NOT_FOUND,
)


async def become_current_if_newest(client: Client, settings: Settings, patience_s: float = 120.0) -> str | None:
    """Make this worker's build current unless a newer build has polled; the build current afterwards.

    Called once the worker polls (a build exists in the deployment only after its first poll). Two
    workers of one build starting together race on the conflict token; the loser sees its build
    current on its next look. Looks back off (with jitter, so a fleet does not retry in step) and
    give up after `patience_s`."""
    if not settings.worker.versioning or settings.worker.become_current == "never":
        return None
    mine = worker_version(settings).build_id
    deadline = asyncio.get_running_loop().time() + patience_s
    pause = 0.25
    while True:
        try:
            deployment = await describe(client, settings)
            build = next((b for b in deployment.builds if b.build_id == mine), None) if deployment else None
            if deployment is not None and build is not None:
                if deployment.current == mine:
                    return mine
                newer = [b for b in deployment.builds if b.created and build.created and b.created > build.created]
                if newer:
                    log.info(
                        "build %s is not the newest of deployment %r (%s is newer): it serves only the "
                        "batches and rollouts pinned to it; new work goes to %s",
                        mine,
                        deployment.name,
                        newer[-1].build_id,
                        deployment.current or "no build",
                    )
                    return deployment.current
                await set_current(client, settings, mine, deployment.conflict_token)
                log.info("build %s is now the current build of deployment %r", mine, deployment.name)
                return mine
        except RPCError as err:
            if err.status not in _LOOK_AGAIN:
                raise
            last = err.message
        else:
            last = "the build is not registered yet"
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError(
                f"build {mine} could not become current in deployment {deployment_name(settings)!r} "
                f"within {patience_s:.0f} s (last answer: {last})"
            )
        await asyncio.sleep(pause * random.uniform(0.5, 1.5))
        pause = min(pause * 2, 5.0)
