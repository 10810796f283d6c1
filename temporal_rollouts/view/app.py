"""The web page `rollouts view` serves: batches and training runs, their rollouts and figures, one trajectory at a time.

A small JSON API over the control layer, temporal_rollouts/client (the same reads as `rollouts list`, `show` and
`train status`) plus one static page that renders it and refreshes while something runs.
Rollout lists come from the visibility store (search attributes: status, stop reason, score),
so filtering a batch of thousands costs one query, not a result fetch per rollout; the
figures are reduced here (figures.py), from closed runs' results read once (outcome_cache.py);
a trajectory is loaded only when it is opened. It binds to loopback by default: it shows
conversations and has no login. It also serves a codec endpoint for the Temporal UI (codec.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from temporal_rollouts.client.records import (
    batch_counts,
    describe_or_none,
    list_batches,
    load_rollout,
    retry_summary,
    rollout_branches,
    status_name,
    waiting_on_retries,
)
from temporal_rollouts.client.rollout_rows import RolloutFilter, list_rollouts
from temporal_rollouts.client.training import FEED, feed_status, list_training_runs
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.feed import FeedStatus
from temporal_rollouts.sandbox.pool import ContainerSlots
from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts, HostGuard
from temporal_rollouts.sandbox_server.http.keys import BearerKey
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.view.codec import codec_routes
from temporal_rollouts.view.figures import Counts, batch_figures, counts_of_rows
from temporal_rollouts.view.outcome_cache import OutcomeCache

KEY_COOKIE = "rollouts_view_key"
"""The cookie that carries the view's key once the page was opened as `/?key=KEY`."""
PAGE = Path(__file__).with_name("page.html")
MAX_ROLLOUTS = 2000
"""Rollouts listed for one batch at most (filters narrow a larger one); the figures count them all."""
FIGURES_WAIT_S = 2.0
"""How long a figures request waits for results not read yet; the rest come with a later refresh."""
KINDS = {"BatchWorkflow": "batch", FEED: "training_run"}


def rollout_filter(request: Request) -> RolloutFilter:
    params = request.query_params

    def number(name: str) -> float | None:
        text = params.get(name) or None
        if text is None:
            return None
        try:
            return float(text)
        except ValueError:
            raise ConfigError(f"{name}: {text!r} is not a number") from None

    return RolloutFilter(
        status=params.get("status") or None,
        stop_reason=params.get("stop_reason") or None,
        min_score=number("min_score"),
        max_score=number("max_score"),
    )


def create_app(
    client: Client,
    transcripts: TranscriptStore,
    ui_origins: list[str] | None = None,
    allowed_hosts: AllowedHosts | None = None,
    key: str | None = None,
    sandboxes: Callable[[], Awaitable[list[ContainerSlots]]] | None = None,
) -> Starlette:
    """`ui_origins`: the Temporal UI's origin(s), allowed to call the codec endpoint from the browser.
    `allowed_hosts`: the names the page answers to (by default a loopback server's); any other Host
    header is refused, so a web page cannot read the conversations through DNS rebinding. `key`:
    every route then needs it, as a bearer token or the cookie the page sets when opened once as
    `/?key=KEY` (`sandbox_server.http.keys`). `sandboxes`: the pool's containers with their image and slots
    (`rollouts slots`), when this process can see them."""
    closed_counts: dict[str, dict[str, Any]] = {}
    first_starts: dict[str, datetime | None] = {}
    finals: dict[str, FeedStatus | None] = {}
    outcomes = OutcomeCache(client)

    async def page(request: Request) -> FileResponse:
        return FileResponse(PAGE, media_type="text/html")

    async def batches(request: Request) -> JSONResponse:
        limit = int(request.query_params.get("limit", "50"))
        found = await list_batches(client, limit, closed_counts, first_starts)
        return JSONResponse([batch.model_dump(mode="json") for batch in found])

    async def runs(request: Request) -> JSONResponse:
        found = await list_training_runs(client, int(request.query_params.get("limit", "50")), finals)
        return JSONResponse([run.model_dump(mode="json") for run in found])

    async def rollouts(request: Request) -> JSONResponse:
        rows = await list_rollouts(client, request.path_params["batch_id"], rollout_filter(request), MAX_ROLLOUTS)
        return JSONResponse([row.model_dump(mode="json", exclude={"turns"}) for row in rows])

    async def figures(request: Request) -> JSONResponse:
        batch_id = request.path_params["batch_id"]
        described = await describe_or_none(client, batch_id)
        if described is None or described.workflow_type not in KINDS:
            raise ConfigError(f"no batch or training run with id {batch_id!r}")
        rows = [row for row in await list_rollouts(client, batch_id) if not row.outside(batch_id)]  # not its forks
        known, pending = await outcomes.outcomes(rows, FIGURES_WAIT_S)
        kind = KINDS[described.workflow_type]
        counts = counts_of_rows(rows)
        if kind == "batch" and (progress := await batch_counts(client, batch_id, described.status)).get("total"):
            done = progress["completed"] + progress["failed"] + progress["running"]
            counts = Counts(
                **{k: progress[k] for k in ("total", "completed", "failed", "running")},
                queued=max(progress["total"] - done, 0),
            )
        shown = batch_figures(batch_id, kind, status_name(described.status), counts, rows, known, pending)
        if kind == "training_run":
            try:
                report = await feed_status(client, batch_id)
                shown.feed, shown.retrying = report.model_dump(mode="json"), report.retrying
            except RPCError as err:
                shown.feed_error = f"the run's figures need a worker to answer its status query ({err.message})"
        elif described.status == WorkflowExecutionStatus.RUNNING:
            shown.retrying = retry_summary(await waiting_on_retries(client, batch_id))
        return JSONResponse(shown.model_dump(mode="json"))

    async def rollout(request: Request) -> JSONResponse:
        record = await load_rollout(client, transcripts, request.path_params["rollout_id"])
        record.branches = await rollout_branches(client, record.rollout_id)  # its children, as `rollouts show` lists
        return JSONResponse(record.shown())

    async def containers(request: Request) -> JSONResponse:
        if sandboxes is None:
            return JSONResponse([])
        return JSONResponse([container.model_dump(mode="json") for container in await sandboxes()])

    async def bad_request(request: Request, exc: Exception) -> JSONResponse:
        message = exc.message if isinstance(exc, ConfigError) else str(exc)
        return JSONResponse({"error": message}, status_code=404 if "no " in message[:3] else 400)

    decode, encode = codec_routes(client.data_converter)
    return Starlette(
        routes=[
            Route("/", page),
            Route("/api/batches", batches),
            Route("/api/runs", runs),
            Route("/api/sandboxes", containers),
            Route("/api/batches/{batch_id}/rollouts", rollouts),
            Route("/api/batches/{batch_id}/figures", figures),
            Route("/api/rollouts/{rollout_id:path}", rollout),
            Route("/codec/decode", decode, methods=["POST"]),
            Route("/codec/encode", encode, methods=["POST"]),
        ],
        exception_handlers={ConfigError: bad_request, ValueError: bad_request},
        middleware=[
            Middleware(HostGuard, allowed=allowed_hosts or AllowedHosts.for_bind("127.0.0.1")),
            *(
                [
                    Middleware(
                        CORSMiddleware,
                        allow_origins=ui_origins,
                        allow_methods=["POST", "GET"],
                        allow_headers=["*"],
                        allow_credentials=True,
                    )
                ]
                if ui_origins
                else []
            ),
            Middleware(BearerKey, key=key, open_paths=(), cookie=KEY_COOKIE),
        ],
    )
