"""The sandbox server: one container's SlotManager over HTTP, started as `python -m temporal_rollouts.sandbox_server`.

Backends start one such process per container. Every endpoint but /health needs
the bearer token, which is read from a file or an environment variable (whichever
the backend's secret mechanism provides) so it never shows on a command line.
Errors travel as `RolloutError.to_payload()` bodies that the client raises again
with their own type.

An acquire long-poll watches its connection: a client that goes away (its worker
died, its request was cancelled) loses its place in line, and a slot granted to it
in that instant is given back at once, so nobody waits behind a dead request and no
slot goes to it. A lease whose response was written but never read is not lost
either: the holder's retried acquire gets the same lease back, and the reaper or the
lease's expiry frees it if the holder never asks again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import os
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import uvicorn
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from temporal_rollouts.sandbox_server.calls import transfer
from temporal_rollouts.sandbox_server.isolation.reaper import adopt_orphans
from temporal_rollouts.sandbox_server.files.beneath import describe
from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts, HostGuard
from temporal_rollouts.sandbox_server.errors import (
    BadToolRequest,
    HarnessGone,
    LeaseLost,
    RolloutError,
    SandboxAuthError,
    SandboxError,
    SandboxLaunchFailed,
    SandboxRequired,
    SandboxUnreachable,
    SlotUnavailable,
    SnapshotTooLarge,
    TransferTooLarge,
)
from temporal_rollouts.sandbox_server.config import ServerConfig
from temporal_rollouts.sandbox_server.volumes.mount_namespace import enter_own_mount_namespace
from temporal_rollouts.sandbox_server.state.persistence import write_json_atomically
from temporal_rollouts.sandbox_server.schema import (
    AcquireRequest,
    CacheQuery,
    CopyRequest,
    DrainRequest,
    ExecuteRequest,
    HarnessAnswerRequest,
    HarnessNextRequest,
    HarnessStartRequest,
    HarnessStopRequest,
    ListQuery,
    NarrowRequest,
    ReleaseRequest,
    RenewRequest,
    SlotLease,
    TransferQuery,
    WithdrawRequest,
    WithdrawResult,
)
from temporal_rollouts.sandbox_server.slots.manager import SlotManager

log = logging.getLogger(__name__)

STATUS_BY_ERROR: dict[type[RolloutError], int] = {
    SandboxAuthError: 401,
    HarnessGone: 404,
    BadToolRequest: 400,
    LeaseLost: 404,
    SlotUnavailable: 503,
    SandboxRequired: 503,
    SandboxUnreachable: 503,
    SandboxLaunchFailed: 503,
    SnapshotTooLarge: 413,
    TransferTooLarge: 413,
}
GRACEFUL_SHUTDOWN_S = 5.0
KEEP_ALIVE_S = 30.0

Model = TypeVar("Model", bound=BaseModel)
Handler = Callable[[Request], Awaitable[BaseModel | list[BaseModel] | Response]]


def create_app(manager: SlotManager, token: str, allowed_hosts: AllowedHosts | None = None) -> Starlette:
    """The server's routes, with the transfer caps of the manager's config; requests for another host
    than `allowed_hosts` (by default a loopback server's names) are refused (`hosts`)."""
    expected = token.encode()
    max_transfer_bytes, max_pack_s = manager.config.max_transfer_bytes, manager.config.max_pack_s

    def authorize(request: Request) -> None:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(presented.strip().encode(), expected):
            raise SandboxAuthError("missing or wrong sandbox bearer token")

    def endpoint(handler: Handler, *, public: bool = False) -> Callable[[Request], Awaitable[Response]]:
        async def respond(request: Request) -> Response:
            try:
                if not public:
                    authorize(request)
                result = await handler(request)
                return result if isinstance(result, Response) else _json_response(result)
            except RolloutError as err:
                return _error_response(err)
            except ClientDisconnect:  # the caller went away (cancelled or died): nobody to answer
                log.debug("%s %s: the client disconnected", request.method, request.url.path)
                return Response(status_code=499)
            except Exception as err:
                log.exception("%s %s failed", request.method, request.url.path)
                return _error_response(SandboxError(f"sandbox server error: {_without_host_paths(err)}"), 500)

        return respond

    async def health(request: Request) -> BaseModel:
        return manager.health()

    async def slots(request: Request) -> list[BaseModel]:
        return list(manager.slot_states())

    async def acquire(request: Request) -> BaseModel:
        return await _acquire_while_connected(manager, request, await _parse(request, AcquireRequest))

    async def withdraw(request: Request) -> BaseModel:
        body = await _parse(request, WithdrawRequest)
        return WithdrawResult(withdrawn=manager.withdraw(body.ticket))

    async def drain(request: Request) -> BaseModel:
        return manager.drain((await _parse(request, DrainRequest)).idle_s)

    async def renew(request: Request) -> BaseModel:
        body = await _parse(request, RenewRequest)
        return manager.renew(body.slot, body.lease_id, body.ttl_s)

    async def release(request: Request) -> BaseModel:
        body = await _parse(request, ReleaseRequest)
        return await manager.release(body.slot, body.lease_id, body.reset, body.reason)

    async def narrow(request: Request) -> BaseModel:
        body = await _parse(request, NarrowRequest)
        return await manager.narrow(body.slot, body.lease_id, body.limits)

    async def execute(request: Request) -> BaseModel:
        return await manager.execute(await _parse(request, ExecuteRequest))

    async def upload(request: Request) -> BaseModel:
        query = _parse_query(request, TransferQuery)
        slot = manager.leased_slot(query.slot, query.lease_id)
        return await transfer.receive(slot, query, request.stream(), max_transfer_bytes, manager.owner(query.slot))

    async def download(request: Request) -> Response:
        query = _parse_query(request, TransferQuery)
        chunks, size, kind = await transfer.send(
            manager.leased_slot(query.slot, query.lease_id), query, max_transfer_bytes, max_pack_s
        )
        headers = {"content-length": str(size), "x-transfer-kind": kind}
        return StreamingResponse(chunks, media_type="application/octet-stream", headers=headers)

    async def copy(request: Request) -> BaseModel:
        body = await _parse(request, CopyRequest)
        source = manager.leased_slot(body.source_slot, body.source_lease_id)
        target = manager.leased_slot(body.slot, body.lease_id)
        if source is target:
            raise BadToolRequest("a slot's workspace cannot be copied onto itself")
        return await transfer.copy_workspace(source, target, body.max_bytes, manager.owner(body.slot), max_pack_s)

    async def list_files(request: Request) -> BaseModel:
        query = _parse_query(request, ListQuery)
        return await asyncio.to_thread(transfer.list_entries, manager.leased_slot(query.slot, query.lease_id), query)

    async def harness_start(request: Request) -> BaseModel:
        return await manager.start_harness(await _parse(request, HarnessStartRequest))

    async def harness_next(request: Request) -> BaseModel:
        return await manager.next_harness_request(await _parse(request, HarnessNextRequest))

    async def harness_answer(request: Request) -> BaseModel:
        return manager.answer_harness_request(await _parse(request, HarnessAnswerRequest))

    async def harness_stop(request: Request) -> BaseModel:
        return await manager.stop_harness(await _parse(request, HarnessStopRequest))

    async def cache_get(request: Request) -> BaseModel:
        return manager.cache.get(_parse_query(request, CacheQuery).name)

    async def cache_put(request: Request) -> BaseModel:
        query = _parse_query(request, CacheQuery)
        return await manager.cache.put(query.name, request.stream(), min(query.max_bytes, max_transfer_bytes))

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager:
            yield

    routes = [
        Route("/health", endpoint(health, public=True), methods=["GET"]),
        Route("/slots", endpoint(slots), methods=["GET"]),
        Route("/slots/acquire", endpoint(acquire), methods=["POST"]),
        Route("/slots/renew", endpoint(renew), methods=["POST"]),
        Route("/slots/release", endpoint(release), methods=["POST"]),
        Route("/slots/withdraw", endpoint(withdraw), methods=["POST"]),
        Route("/slots/limits", endpoint(narrow), methods=["POST"]),
        Route("/slots/copy", endpoint(copy), methods=["POST"]),
        Route("/drain", endpoint(drain), methods=["POST"]),
        Route("/execute", endpoint(execute), methods=["POST"]),
        Route("/files", endpoint(upload), methods=["PUT"]),
        Route("/files", endpoint(download), methods=["GET"]),
        Route("/files/list", endpoint(list_files), methods=["GET"]),
        Route("/cache", endpoint(cache_get), methods=["GET"]),
        Route("/cache", endpoint(cache_put), methods=["PUT"]),
        Route("/harness/start", endpoint(harness_start), methods=["POST"]),
        Route("/harness/next", endpoint(harness_next), methods=["POST"]),
        Route("/harness/answer", endpoint(harness_answer), methods=["POST"]),
        Route("/harness/stop", endpoint(harness_stop), methods=["POST"]),
    ]
    allowed = allowed_hosts or AllowedHosts.for_bind("127.0.0.1")
    return Starlette(routes=routes, lifespan=lifespan, middleware=[Middleware(HostGuard, allowed=allowed)])


async def _acquire_while_connected(manager: SlotManager, request: Request, body: AcquireRequest) -> SlotLease:
    """Race the acquire against the client leaving; see the module docstring."""
    ticket = body.ticket or f"server-{uuid.uuid4().hex}"
    attempt = asyncio.create_task(manager.take(body.holder, body.ttl_s, body.wait_s, body.allow_network, ticket))
    watcher = asyncio.create_task(_client_left(request))
    try:
        done, _ = await asyncio.wait({attempt, watcher}, return_when=asyncio.FIRST_COMPLETED)
    except BaseException:
        attempt.cancel()
        raise
    finally:
        watcher.cancel()
    left = watcher in done
    if left and attempt not in done:
        manager.withdraw(ticket, reason="disconnected")
    grant = await attempt
    if left:
        if grant.fresh:
            manager.give_back(grant.lease, reason="disconnected")
        raise SlotUnavailable("the client went away before its slot was granted")
    return grant.lease


async def _client_left(request: Request) -> None:
    """Return once the client has disconnected; the body was read, so the next ASGI message is the disconnect."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except Exception:
        log.exception("watching the acquire connection failed; treating the client as gone")


async def _parse(request: Request, model: type[Model]) -> Model:
    body = await request.body()
    try:
        return model.model_validate_json(body)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'body'}: {error['msg']}" for error in err.errors()
        )
        raise BadToolRequest(f"invalid {model.__name__}: {problems}") from None


def _parse_query(request: Request, model: type[Model]) -> Model:
    try:
        return model.model_validate(dict(request.query_params))
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'query'}: {e['msg']}" for e in err.errors())
        raise BadToolRequest(f"invalid {model.__name__}: {problems}") from None


def _json_response(result: BaseModel | list[BaseModel]) -> Response:
    if isinstance(result, list):
        body = json.dumps([item.model_dump(mode="json") for item in result])
    else:
        body = result.model_dump_json()
    return Response(body, media_type="application/json")


def _without_host_paths(err: Exception) -> str:
    """What went wrong, for a caller that may relay it to the agent: the error's kind (and an OSError's
    reason), never its message, which can name host paths. The server's log has the whole error."""
    if isinstance(err, OSError):
        return f"{type(err).__name__}: {describe(err)}"
    return type(err).__name__


def _error_response(err: RolloutError, status: int | None = None) -> Response:
    status = status or next((code for cls, code in STATUS_BY_ERROR.items() if isinstance(err, cls)), 500)
    return Response(json.dumps(err.to_payload()), status_code=status, media_type="application/json")


def read_token(token_file: Path | None = None, token_env: str | None = None) -> str:
    """The bearer token from `--token-file` or from the variable `--token-env` names (then dropped
    from this process's environment, so commands in the slots never inherit it)."""
    if token_file is not None:
        token = token_file.read_text(encoding="utf-8").strip()
        if not token:
            raise SystemExit(f"token file {token_file} is empty")
        return token
    if token_env is None:
        raise SystemExit("give the bearer token with --token-file or --token-env")
    token = os.environ.pop(token_env, "").strip()
    if not token:
        raise SystemExit(f"environment variable {token_env} (--token-env) is not set or empty")
    return token


async def serve(config: ServerConfig) -> None:
    adopt_orphans()  # bubblewrap's orphaned inits come to this process, which reaps them (`reaper`)
    manager = SlotManager(config)
    app = create_app(
        manager,
        read_token(config.token_file, config.token_env),
        AllowedHosts.for_bind(config.host, config.allowed_hosts),
    )
    listener = _tcp_listener(config.host, config.port)
    uvicorn_config = uvicorn.Config(
        app,
        log_config=None,
        access_log=False,
        proxy_headers=False,  # nothing here reads the client's address: no per-request header rewrite
        lifespan="on",
        timeout_graceful_shutdown=GRACEFUL_SHUTDOWN_S,
        # Longer than the sandbox client's keep-alive (15 s), so a client never reuses a connection the server is closing.
        timeout_keep_alive=KEEP_ALIVE_S,
    )
    server = _SandboxServer(uvicorn_config, manager)
    announcer = asyncio.create_task(_announce_when_started(server, listener, config))
    try:
        await server.serve(sockets=[listener])
    finally:
        announcer.cancel()


class _SandboxServer(uvicorn.Server):
    """Stops running operations as soon as shutdown begins, so open requests end with a retryable
    error instead of holding the shutdown until the longest command finishes."""

    def __init__(self, config: uvicorn.Config, manager: SlotManager) -> None:
        super().__init__(config)
        self.manager = manager

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        await self.manager.close()
        await super().shutdown(sockets)


def _tcp_listener(host: str, port: int) -> socket.socket:
    """A listening socket created as IPPROTO_TCP: asyncio turns Nagle off only on connections
    accepted from such a socket, and with Nagle on every small reply waits ~40 ms for an ACK."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(2048)
    return listener


async def _announce_when_started(server: uvicorn.Server, listener: socket.socket, config: ServerConfig) -> None:
    while not server.started:
        await asyncio.sleep(0.02)
    port = listener.getsockname()[1]
    host = "127.0.0.1" if config.host in ("0.0.0.0", "") else config.host
    url = f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"
    log.info("sandbox %s serving %d slots at %s", config.container_id, config.slots_per_container, url)
    if config.ready_file:
        write_json_atomically(config.ready_file, {"url": url, "pid": os.getpid(), "container_id": config.container_id})


def main(argv: list[str] | None = None) -> None:
    config = ServerConfig.from_argv(argv, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if config.slot_volume != "checked":
        enter_own_mount_namespace()  # before any thread: the slots' volumes then go with this process
    asyncio.run(serve(config))
