"""What the worker asks a sandbox server, declared once: each request model with its route and reply.

The request models are the sandbox server's own (`sandbox_server.schema`), so both ends parse
the same thing; this table adds how each one travels. The HTTP client sends any of them with
one method, and the fleet and the pool pass them along without knowing which one they carry,
so an operation's parameters are written in its model and nowhere else on the way down.

Two requests need a word. An acquire with a `ticket` can be taken out of line by a
`WithdrawRequest` for that ticket; its own call then fails with SlotUnavailable (withdrawn=False
means it was not waiting, so it answers on its own). Cancelling a waiting acquire closes its
connection, which also takes it out of line. A `DrainRequest` asks the server to refuse new
leases if it has been idle that long; the answer says whether it now does.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, TypeAdapter

from temporal_rollouts.sandbox_server.schema import (
    AcquireRequest,
    CacheEntry,
    CacheQuery,
    CopyRequest,
    DrainRequest,
    DrainResult,
    ExecOp,
    ExecuteRequest,
    FileListing,
    HarnessAnswered,
    HarnessAnswerRequest,
    HarnessNext,
    HarnessNextRequest,
    HarnessStartRequest,
    HarnessStopRequest,
    HarnessState,
    HealthStatus,
    ListQuery,
    NarrowRequest,
    ReleaseRequest,
    ReleaseResult,
    RenewRequest,
    SessionOp,
    SlotLease,
    SlotLimitsRequest,
    SlotState,
    ToolOutput,
    TransferQuery,
    TransferResult,
    WithdrawRequest,
    WithdrawResult,
)

OPERATION_MARGIN_S = 30.0
"""How long past its own timeout the answer to an operation may take."""


class HealthQuery(BaseModel):
    """`GET /health`: the container's id, free slots, waiters, isolation and limits."""


class SlotsQuery(BaseModel):
    """`GET /slots`: every slot with its lease, if any."""


def _no_extra_time(request: Any) -> float:
    return 0.0


@dataclass(frozen=True)
class Route:
    method: Literal["GET", "POST", "PUT"]
    path: str
    reply: TypeAdapter[Any] = field(repr=False)
    runs_for: Callable[[Any], float] = _no_extra_time
    """Seconds the server may spend on the request beyond the client's own timeout."""


def _route(
    method: Literal["GET", "POST", "PUT"], path: str, reply: Any, runs_for: Callable[[Any], float] = _no_extra_time
) -> Route:
    return Route(method, path, TypeAdapter(reply), runs_for)


COPY_TIME_S = 600.0
"""How long a server may take to copy a workspace between two of its slots (it packs and unpacks it)."""


HARNESS_STOP_S = 30.0
"""How long a server may take to stop a harness and everything it started."""


def _operation_time(request: ExecuteRequest) -> float:
    operation = request.operation
    return OPERATION_MARGIN_S + (operation.timeout_s if isinstance(operation, ExecOp | SessionOp) else 0.0)


ROUTES: dict[type[BaseModel], Route] = {
    HealthQuery: _route("GET", "/health", HealthStatus),
    SlotsQuery: _route("GET", "/slots", list[SlotState]),
    AcquireRequest: _route("POST", "/slots/acquire", SlotLease, lambda request: request.wait_s),
    WithdrawRequest: _route("POST", "/slots/withdraw", WithdrawResult),
    DrainRequest: _route("POST", "/drain", DrainResult),
    RenewRequest: _route("POST", "/slots/renew", SlotLease),
    ReleaseRequest: _route("POST", "/slots/release", ReleaseResult),
    NarrowRequest: _route("POST", "/slots/limits", SlotLimitsRequest),
    CopyRequest: _route("POST", "/slots/copy", TransferResult, lambda request: COPY_TIME_S),
    ExecuteRequest: _route("POST", "/execute", ToolOutput, _operation_time),
    ListQuery: _route("GET", "/files/list", FileListing),
    CacheQuery: _route("GET", "/cache", CacheEntry),
    HarnessStartRequest: _route("POST", "/harness/start", HarnessState),
    HarnessNextRequest: _route("POST", "/harness/next", HarnessNext, lambda request: request.wait_s),
    HarnessAnswerRequest: _route("POST", "/harness/answer", HarnessAnswered),
    HarnessStopRequest: _route("POST", "/harness/stop", HarnessState, lambda request: HARNESS_STOP_S),
}
"""Requests answered with one JSON body: a GET sends the model as query parameters, a POST as its body."""

UPLOADS: dict[type[BaseModel], Route] = {
    TransferQuery: _route("PUT", "/files", TransferResult),
    CacheQuery: _route("PUT", "/cache", CacheEntry),
}
"""Requests whose body is a local file, streamed: into a slot's workspace, or into the container's cache."""

DOWNLOAD = _route("GET", "/files", bytes)
"""A slot's file, or a folder as a tar stream, streamed back; its kind is in the `x-transfer-kind` header."""


def route_of(request: BaseModel, table: dict[type[BaseModel], Route] = ROUTES) -> Route:
    try:
        return table[type(request)]
    except KeyError:
        raise TypeError(f"a sandbox server takes no {type(request).__name__}") from None
