"""One harness's model endpoint: OpenAI chat completions on a unix socket, answered by the rollout's workflow.

The sandbox server cannot answer a model call itself: each call is a step of the rollout's
workflow, run by some worker. So a request is held here, by an id, until the workflow takes it
(`next`: the oldest unanswered one, the same one until it is answered, so a take retried by
another worker loses nothing) and answers it (`answer`: a second answer of an id changes
nothing). The harness's connection stays open meanwhile; a worker that died costs it time only.
A harness that gave up waiting and sends the same request again (its client's retry) is
attached to the held one, or answered at once from the answer its first try missed, so one
request never costs two model turns.

Only this harness can use it: the socket is bound into its slot alone, and every request must
carry the key it was given (`Authorization: Bearer`, as OpenAI's clients send `OPENAI_API_KEY`).
It cannot take more than its share either: a request body is capped, at most `MAX_PENDING`
requests wait at once (more are answered 429), and uvicorn answers 503 past `MAX_CONNECTIONS`
open connections. Every model call it makes is a turn of its own rollout, counted against that
rollout's limits by the workflow, never another's.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import socket
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from temporal_rollouts.sandbox_server.schema import PendingModelRequest

MAX_BODY_BYTES = 32 * 1024 * 1024
"""A request past this is refused: a conversation of that size is far past any context budget."""
MAX_PENDING = 4
"""Requests of one harness waiting at once; the workflow answers them one at a time."""
MAX_CONNECTIONS = 16
"""Open connections of one harness; past it uvicorn answers 503 (a flood of connections buys nothing)."""
KEPT_ANSWERS = 4
"""Answers whose caller had gone, kept for the same request sent again."""


@dataclass
class Held:
    request_id: str
    body: dict[str, Any]
    digest: str
    stream: bool
    answer: asyncio.Future[tuple[int, dict[str, Any]]] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )
    waiting: int = 0
    """Connections waiting on it now (the first try, or a retry of the same request)."""


class ModelEndpoint:
    def __init__(self, socket_path: Path, key: str, model: str) -> None:
        self.socket_path = socket_path
        self.model = model
        self._key = key.encode()
        self._held: OrderedDict[str, Held] = OrderedDict()
        self._missed: OrderedDict[str, tuple[int, dict[str, Any]]] = OrderedDict()
        self._arrived = asyncio.Event()
        self._server: uvicorn.Server | None = None
        self.calls = 0

    async def start(self) -> None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        folder = os.open(self.socket_path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:  # through the folder's descriptor: a socket's path may not be longer than 107 bytes
            listener.bind(f"/proc/self/fd/{folder}/{self.socket_path.name}")
        finally:
            os.close(folder)
        os.chmod(self.socket_path, 0o666)  # the slot's uid connects; the folder is bound into its slot alone
        listener.listen(64)
        app = Starlette(
            routes=[
                Route("/v1/chat/completions", self._chat, methods=["POST"]),
                Route("/chat/completions", self._chat, methods=["POST"]),
                Route("/v1/models", self._models, methods=["GET"]),
            ]
        )
        config = uvicorn.Config(
            app, log_config=None, access_log=False, lifespan="off", limit_concurrency=MAX_CONNECTIONS
        )
        config.load()
        self._server = uvicorn.Server(config)
        # As `Server.serve` starts, without its signal handlers (the process's are the sandbox server's) and
        # without its main loop (a tick every 0.1 s per harness): the socket's connections are all it needs.
        self._server.lifespan = config.lifespan_class(config)
        await self._server.startup(sockets=[listener])

    async def close(self) -> None:
        for held in self._held.values():
            if not held.answer.done():
                held.answer.cancel()
        if self._server is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception):
                await self._server.shutdown()
        self.socket_path.unlink(missing_ok=True)

    async def next(self, wait_s: float, ended: asyncio.Event) -> PendingModelRequest | None:
        """The oldest unanswered request, waiting up to `wait_s` for one (or until the harness has ended)."""
        deadline = time.monotonic() + wait_s
        while True:
            if (held := next(iter(self._held.values()), None)) is not None:
                return PendingModelRequest(request_id=held.request_id, body=held.body)
            left = deadline - time.monotonic()
            if left <= 0 or ended.is_set():
                return None
            self._arrived.clear()
            waits = {asyncio.ensure_future(self._arrived.wait()), asyncio.ensure_future(ended.wait())}
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            for task in waits:
                task.cancel()

    def answer(self, request_id: str, status: int, body: dict[str, Any]) -> bool:
        """Answer a held request; False when it was answered before or nobody waits for it any more."""
        held = self._held.pop(request_id, None)
        if held is None or held.answer.done():
            return False
        held.answer.set_result((status, body))
        if held.waiting:
            return True
        self._missed[held.digest] = (status, body)
        while len(self._missed) > KEPT_ANSWERS:
            self._missed.popitem(last=False)
        return False

    def _authorized(self, request: Request) -> bool:
        scheme, _, presented = request.headers.get("authorization", "").partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), self._key)

    async def _models(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "missing or wrong API key", "authentication_error")
        return JSONResponse({"object": "list", "data": [{"id": self.model, "object": "model", "owned_by": "rollouts"}]})

    async def _chat(self, request: Request) -> Response:
        if not self._authorized(request):
            return _error(401, "missing or wrong API key", "authentication_error")
        raw = bytearray()
        async for chunk in request.stream():
            raw += chunk
            if len(raw) > MAX_BODY_BYTES:
                return _error(413, f"the request is over {MAX_BODY_BYTES} bytes", "invalid_request_error")
        try:
            body = json.loads(raw)
        except ValueError:
            return _error(400, "the request body is not JSON", "invalid_request_error")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _error(400, "not a chat completion request: `messages` must be a list", "invalid_request_error")
        digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
        stream = body.get("stream") is True
        if (missed := self._missed.pop(digest, None)) is not None:
            return _respond(*missed, stream)
        held = next((h for h in self._held.values() if h.digest == digest and not h.waiting), None)
        if held is None:
            if len(self._held) >= MAX_PENDING:
                return _error(429, f"at most {MAX_PENDING} requests may wait at once", "rate_limit_error")
            held = Held(request_id=uuid.uuid4().hex, body=body, digest=digest, stream=stream)
            self._held[held.request_id] = held
            self.calls += 1
            self._arrived.set()
        held.waiting += 1
        gone = asyncio.ensure_future(_until_disconnected(request))
        try:
            await asyncio.wait({held.answer, gone}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
            held.waiting -= 1
        if not held.answer.done():  # its client gave up: the request stays held for a retry of it to wait on
            return Response(status_code=499)
        if held.answer.cancelled():  # the endpoint closed (the harness was stopped): nobody will answer
            return _error(503, "the rollout stopped", "server_error")
        return _respond(*held.answer.result(), stream)


async def _until_disconnected(request: Request) -> None:
    """Returns when the client has closed its connection (its body was read whole, so that is all that comes)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _respond(status: int, body: dict[str, Any], stream: bool) -> Response:
    if not stream or status != 200:
        return JSONResponse(body, status)
    return StreamingResponse(_events(body), media_type="text/event-stream")


async def _events(completion: dict[str, Any]):
    """A whole completion as server-sent chunks, as OpenAI streams one: the reply in one delta, then the end."""
    choice = completion["choices"][0]
    delta = {"role": "assistant", **{k: v for k, v in choice["message"].items() if k != "role"}}
    if "tool_calls" in delta:
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(delta["tool_calls"])]
    base = {key: completion[key] for key in ("id", "created", "model")} | {"object": "chat.completion.chunk"}
    yield f"data: {json.dumps(base | {'choices': [{'index': 0, 'delta': delta, 'finish_reason': None}]})}\n\n"
    end = {"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}
    yield f"data: {json.dumps(base | {'choices': [end], 'usage': completion.get('usage')})}\n\n"
    yield "data: [DONE]\n\n"


def _error(status: int, message: str, kind: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status)
