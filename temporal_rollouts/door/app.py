"""The door's HTTP routes: a trainer takes a training run's numbered batches and acknowledges them.

    POST /runs/{run}/register              {"batch_size", "starting_step"?} (Atropos' /register body too)
    POST /runs/{run}/take                  {"consumer"?, "lease_s"?, "trainer_version"?, "request_id"?}
         -> {"batch": {"number", "lease", "deadline", "deliveries", "trainer_version", "final", "groups"} | null,
             "acknowledged_below", "next_number"}; 410 once the run is done and everything acknowledged
    POST /runs/{run}/batches/{number}/ack       {"lease"} -> {"status", "number", "acknowledged_below"}
    POST /runs/{run}/batches/{number}/release   {"lease"}: give a batch back untrained
    GET  /runs/{run}                        the run's status (figures, trainer, door)
    GET  /health

Atropos' trainer side of `run-api`, with `http://HOST:PORT/runs/{run}` as its API address:
`POST /register`, `GET /batch` (the next batch's groups; asking again acknowledges the batch this
trainer took before, as an Atropos trainer asks only once it has trained it), `GET /status`,
`GET /info`, `GET /wandb_info`.

Every route but `/health` needs `Authorization: Bearer KEY` when the endpoint has a key
(`sandbox_server.http.keys`: compared in constant time), and a key is required to listen beyond loopback.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from temporal_rollouts.client.door import DoorRefused, RunDoors
from temporal_rollouts.core.door import AckRequest, RegisterRequest, ReleaseRequest, TakeRequest
from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts, HostGuard
from temporal_rollouts.sandbox_server.http.keys import BearerKey

ATROPOS_CONSUMER = "atropos"


class TakeBody(TakeRequest):
    request_id: str | None = None
    """Sent again with a retried take: the run answers it with the first answer (an Update id)."""


class LeaseBody(BaseModel):
    lease: str


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "code": status}}, status_code=status)


async def _body(request: Request, model: type[BaseModel]) -> Any:
    try:
        raw = await request.json() if await request.body() else {}
    except ValueError:
        raise DoorRefused(400, "the body must be JSON") from None
    try:
        return model.model_validate(raw)
    except ValidationError as err:
        raise DoorRefused(400, "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors()))


def _run(request: Request) -> str:
    return request.path_params["run"]


def create_app(
    doors: RunDoors,
    api_key: str | None = None,
    allowed_hosts: AllowedHosts | None = None,
    atropos_lease_s: float = 600.0,
) -> Starlette:
    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def register(request: Request) -> JSONResponse:
        registration = await _body(request, RegisterRequest)
        status = await doors.register(_run(request), registration)
        return JSONResponse({"uuid": uuid.uuid4().int, **status.model_dump(mode="json")})

    async def take(request: Request) -> JSONResponse:
        body = await _body(request, TakeBody)
        take = TakeRequest.model_validate(body.model_dump(exclude={"request_id"}))
        return JSONResponse(await doors.take(_run(request), take, body.request_id))

    async def ack(request: Request) -> JSONResponse:
        body = await _body(request, LeaseBody)
        answer = await doors.acknowledge(_run(request), AckRequest(number=_number(request), lease=body.lease))
        return JSONResponse(answer.model_dump(mode="json"))

    async def release(request: Request) -> JSONResponse:
        body = await _body(request, LeaseBody)
        await doors.release(_run(request), ReleaseRequest(number=_number(request), lease=body.lease))
        return JSONResponse({"status": "released"})

    async def status(request: Request) -> JSONResponse:
        return JSONResponse((await doors.status(_run(request))).model_dump(mode="json"))

    # ---------------------------------------------------------------- Atropos' trainer side of run-api

    async def atropos_batch(request: Request) -> JSONResponse:
        take = TakeRequest(consumer=ATROPOS_CONSUMER, lease_s=atropos_lease_s, ack_previous=True)
        try:
            answer = await doors.take(_run(request), take)
        except DoorRefused as refused:
            if refused.status != 410:
                raise
            return JSONResponse({"batch": None})
        batch = answer["batch"]
        return JSONResponse({"batch": None if batch is None else batch["groups"]})

    async def atropos_status(request: Request) -> JSONResponse:
        door = (await doors.status(_run(request))).door
        if door is None:
            raise DoorRefused(409, f"training run {_run(request)} has no door (its sink is not door)")
        return JSONResponse({"current_step": door.trainer_version, "queue_size": door.pending_groups})

    async def atropos_info(request: Request) -> JSONResponse:
        door = (await doors.status(_run(request))).door
        return JSONResponse({"batch_size": door.batch_size if door and door.batch_size else -1, "max_token_len": -1})

    async def atropos_wandb_info(request: Request) -> JSONResponse:
        return JSONResponse({"group": None, "project": None})

    async def refusals(request: Request, call_next):
        try:
            return await call_next(request)
        except DoorRefused as refused:
            if refused.status == 204:
                return JSONResponse({"batch": None})
            return _error(refused.status, refused.message)

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/runs/{run}", status),
            Route("/runs/{run}/register", register, methods=["POST"]),
            Route("/runs/{run}/take", take, methods=["POST"]),
            Route("/runs/{run}/batches/{number:int}/ack", ack, methods=["POST"]),
            Route("/runs/{run}/batches/{number:int}/release", release, methods=["POST"]),
            Route("/runs/{run}/batch", atropos_batch),
            Route("/runs/{run}/status", atropos_status),
            Route("/runs/{run}/info", atropos_info),
            Route("/runs/{run}/wandb_info", atropos_wandb_info),
        ],
        middleware=[
            Middleware(HostGuard, allowed=allowed_hosts or AllowedHosts.for_bind("127.0.0.1")),
            Middleware(BearerKey, key=api_key),
            Middleware(BaseHTTPMiddleware, dispatch=refusals),
        ],
    )


def _number(request: Request) -> int:
    return int(request.path_params["number"])
