"""The web page `rollouts view` serves: batches, their rollouts, and one trajectory at a time.

A small JSON API over temporal_rollouts/cli/records.py (the same reads as `rollouts
show` and `export`) plus one static page that renders it. Rollout lists come from the
visibility store (search attributes: status, stop reason, score), so filtering a batch of
thousands costs one query, not a result fetch per rollout; a trajectory is loaded only
when it is opened. It binds to loopback by default: it shows conversations and has no login.
It also serves a codec endpoint for the Temporal UI (codec.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route
from temporalio.client import Client

from temporal_rollouts.sandbox_server.hosts import AllowedHosts, HostGuard
from temporal_rollouts.core import search_attributes as sa
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.records import StopReason
from temporal_rollouts.cli.records import (
    list_batches,
    load_rollout,
    quoted,
    status_name,
)
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.view.codec import codec_routes

PAGE = Path(__file__).with_name("page.html")
MAX_ROLLOUTS = 2000
"""Rollouts listed for one batch at most (the list is paged by the visibility store)."""

STATUS_FILTERS = {
    "running": "Running", "completed": "Completed", "failed": "Failed", "canceled": "Canceled",
    "terminated": "Terminated", "timed_out": "TimedOut",
}


def rollouts_query(batch_id: str, status: str | None, stop_reason: str | None) -> str:
    """The visibility query for a batch's rollouts, filtered; unknown filter values are refused."""
    clauses = [f"RolloutBatchId = {quoted(batch_id)}", "WorkflowType = 'TrajectoryWorkflow'"]
    if status:
        if status not in STATUS_FILTERS:
            raise ConfigError(f"unknown status {status!r}: one of {', '.join(STATUS_FILTERS)}")
        clauses.append(f"ExecutionStatus = '{STATUS_FILTERS[status]}'")
    if stop_reason:
        if stop_reason not in {reason.value for reason in StopReason}:
            raise ConfigError(f"unknown stop reason {stop_reason!r}")
        clauses.append(f"RolloutStopReason = '{stop_reason}'")
    return " AND ".join(clauses)


def create_app(
    client: Client, transcripts: TranscriptStore, ui_origins: list[str] | None = None,
    allowed_hosts: AllowedHosts | None = None,
) -> Starlette:
    """`ui_origins`: the Temporal UI's origin(s), allowed to call the codec endpoint from the browser.
    `allowed_hosts`: the names the page answers to (by default a loopback server's); any other Host
    header is refused, so a web page cannot read the conversations through DNS rebinding."""
    async def page(request: Request) -> FileResponse:
        return FileResponse(PAGE, media_type="text/html")

    async def batches(request: Request) -> JSONResponse:
        limit = int(request.query_params.get("limit", "50"))
        found = await list_batches(client, limit)
        return JSONResponse([batch.model_dump(mode="json") for batch in found])

    async def rollouts(request: Request) -> JSONResponse:
        query = rollouts_query(request.path_params["batch_id"], request.query_params.get("status") or None,
                               request.query_params.get("stop_reason") or None)
        rows: dict[str, dict[str, Any]] = {}
        async for execution in client.list_workflows(query, limit=MAX_ROLLOUTS):
            if execution.id in rows:  # an earlier run of a resumed rollout
                continue
            attributes = execution.typed_search_attributes
            rows[execution.id] = {
                "rollout_id": execution.id, "status": status_name(execution.status),
                "item_id": attributes.get(sa.ITEM_ID), "stop_reason": attributes.get(sa.STOP_REASON),
                "score": attributes.get(sa.SCORE),
                "started_at": execution.start_time.isoformat() if execution.start_time else None,
                "closed_at": execution.close_time.isoformat() if execution.close_time else None,
            }
        return JSONResponse(sorted(rows.values(), key=lambda row: row["rollout_id"]))

    async def rollout(request: Request) -> JSONResponse:
        record = await load_rollout(client, transcripts, request.path_params["rollout_id"])
        return JSONResponse(record.model_dump(mode="json", exclude_none=True))

    async def bad_request(request: Request, exc: Exception) -> JSONResponse:
        message = exc.message if isinstance(exc, ConfigError) else str(exc)
        return JSONResponse({"error": message}, status_code=404 if "no " in message[:3] else 400)

    decode, encode = codec_routes(client.data_converter)
    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/batches", batches),
            Route("/api/batches/{batch_id}/rollouts", rollouts),
            Route("/api/rollouts/{rollout_id:path}", rollout),
            Route("/codec/decode", decode, methods=["POST"]),
            Route("/codec/encode", encode, methods=["POST"]),
        ],
        exception_handlers={ConfigError: bad_request, ValueError: bad_request},
        middleware=[
            Middleware(HostGuard, allowed=allowed_hosts or AllowedHosts.for_bind("127.0.0.1")),
            *([Middleware(CORSMiddleware, allow_origins=ui_origins, allow_methods=["POST", "GET"],
                          allow_headers=["*"], allow_credentials=True)] if ui_origins else []),
        ],
    )
