"""The demo policy: an OpenAI-compatible chat server that replays reference solutions.

This is a test and demo fixture, NOT a model. It recognises a task by the first
user message of the conversation, counts the assistant turns already in the
request, and answers with that turn of the task's reference solution as tool
calls, then with a final "Done." once the solution is played out. A demo batch
therefore scores 1.0 through the real path (workflow, model client, sandbox
tools, verify) without a GPU or an API key.

It answers an agent harness's calls too (a rollout whose agent runs in the slot,
docs/harnesses.md): the harness wraps the task in its own prompt, so a known task
prompt found inside the first user message counts; where the harness offers its own
shell tool instead of ours, each scripted call is written as the command that does
the same (`shell_calls`); and it ends as the harness's prompt says, by running the
submit command it names (mini-swe-agent), else with "Done." and no tool call.

It also injects faults on demand, so tests and demos can show what the rollout
machinery does with a flaky or broken model server. Faults are set with CLI
flags at start, and at runtime with POST /control: a test-only admin endpoint that exists
only when the server is started with `--enable-control` (`enable_control=True` in process),
and then answers only callers on the loopback interface:

    fail_next          n requests answered with `fail_status` (default 503),
                       with a Retry-After header when `retry_after` is set
    fail_rate, seed    fail each request with this probability
    delay_s            sleep this long before answering every request
    malformed_next     n replies whose tool call arguments are broken JSON
    garbage_next       n replies whose body is not a chat completion
    unknown_tool_next  n replies that call a tool named `teleport`

The turn number skips assistant messages this server broke on purpose (a call
to `teleport`, arguments that are not JSON), so a conversation that survives a
fault still plays the whole solution. GET /stats counts requests by outcome and
lists, per conversation, the turn numbers requested: tests use it to prove that
a resumed rollout did not send a finished turn again.

Run it with `python -m temporal_rollouts.policy_servers.demo --port 8765 [fault flags]`, or in process
with `build_app`, `serve` (async) or `start_in_thread`.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import ipaddress
import json
import logging
import random
import secrets
import socket
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from temporal_rollouts.core.inputs import field_default
from temporal_rollouts.core.settings import DemoPolicySettings
from temporal_rollouts.core.tasks import ScriptedCall
from temporal_rollouts.policy_servers.shell_calls import as_shell, shell_tool, submit_command
from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts, HostGuard
from temporal_rollouts.sandbox_server.http.keys import (
    BearerKey,
    add_key_argument,
    is_loopback_bind,
    key_from_env,
    require_key,
)
from temporal_rollouts.tools.catalogue import TOOLS

log = logging.getLogger(__name__)

MODEL_ID = "demo-policy"
MODEL_DESCRIPTION = "Test and demo policy, not a model: replays each task's reference solution as tool calls."
UNKNOWN_TOOL = "teleport"
INDEX_LIMIT = 1000
"""Most items indexed per env that cannot read a solution back from a prompt."""

Turns = list[list[ScriptedCall]]


class Faults(BaseModel):
    """What to break, and how often; the `*_next` counters go down as faults are served."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    fail_next: int = Field(default=0, ge=0, description="answer the next N requests with fail_status")
    fail_status: int = Field(default=503, ge=400, le=599, description="HTTP status of an injected failure")
    retry_after: float | None = Field(default=None, ge=0, description="Retry-After seconds sent with a failure")
    fail_rate: float = Field(default=0.0, ge=0.0, le=1.0, description="fail each request with this probability")
    seed: int | None = Field(default=None, description="seed of the fail_rate coin")
    delay_s: float = Field(default=0.0, ge=0.0, description="sleep this long before answering each request")
    malformed_next: int = Field(default=0, ge=0, description="break the tool call arguments of the next N replies")
    garbage_next: int = Field(default=0, ge=0, description="answer the next N requests with a non-completion body")
    unknown_tool_next: int = Field(default=0, ge=0, description=f"make the next N replies call `{UNKNOWN_TOOL}`")


def conversation_key(first_user_message: str) -> str:
    """The key under which /stats lists a conversation's turns."""
    return hashlib.sha256(first_user_message.encode()).hexdigest()[:16]


class SolutionIndex:
    """First user message -> reference solution, over every registered env, built on first use: the bundled
    envs, installed packages' (entry points) and those of `env_modules` (modules or .py files, as the
    workers' settings name them), and the Harbor task folders of `harbor_tasks` (`demo_policy.harbor_tasks`)."""

    def __init__(self, env_modules: Sequence[str] = (), harbor_tasks: Sequence[str] = ()) -> None:
        self._by_prompt: dict[str, Turns] | None = None
        self._longest_first: list[str] = []
        self._readers: list[Callable[[str], Turns | None]] = []
        self.env_modules = list(env_modules)
        self.harbor_tasks = list(harbor_tasks)
        """Folders of Harbor tasks whose solutions it knows besides `examples/harbor`'s (the env `harbor`'s default)."""

    def _build(self) -> dict[str, Turns]:
        import envs
        from envs.sources import load_env_sources

        for problem in load_env_sources(self.env_modules):
            log.warning("demo policy: %s; its tasks will be unknown", problem.line())
        by_prompt: dict[str, Turns] = {}
        named = [(name, {}) for name in envs.env_names()] + [("harbor", {"path": path}) for path in self.harbor_tasks]
        for name, config in named:
            try:
                env = envs.get_env(name, config)
                if callable(reader := getattr(env, "solution_for_prompt", None)):
                    self._readers.append(reader)
                    continue
                seen: set[str] = set()
                for item in env.load_items(INDEX_LIMIT):
                    if item.id in seen:
                        break
                    seen.add(item.id)
                    if (turns := env.reference_solution(item)) is not None:
                        by_prompt[env.format_prompt(item).strip()] = turns
            except Exception:
                log.exception("demo policy: cannot index env %r %s; its tasks will be unknown", name, config or "")
        log.info("demo policy indexed %d prompts and %d prompt readers", len(by_prompt), len(self._readers))
        return by_prompt

    def lookup(self, prompt: str) -> Turns | None:
        """The solution of the task `prompt` states: its prompt exactly, one a reader recognises, or the
        longest known prompt inside it (a harness wraps the task in its own words)."""
        if self._by_prompt is None:
            self._by_prompt = self._build()
            self._longest_first = sorted(self._by_prompt, key=len, reverse=True)
        prompt = prompt.strip()
        if (turns := self._by_prompt.get(prompt)) is not None:
            return turns
        for reader in self._readers:
            if (turns := reader(prompt)) is not None:
                return turns
        known = next((known for known in self._longest_first if known and known in prompt), None)
        return None if known is None else self._by_prompt[known]


class Stats:
    """Request counters for GET /stats."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0
        self.by_outcome: Counter[str] = Counter()
        self.turns: dict[str, list[int]] = {}

    def record_turn(self, key: str, turn: int) -> None:
        self.turns.setdefault(key, []).append(turn)

    def snapshot(self) -> dict[str, Any]:
        return {"total": self.total, "by_outcome": dict(self.by_outcome), "conversations": self.turns}


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return ""


def _is_sabotaged(message: dict[str, Any]) -> bool:
    """True for an assistant reply this server broke on purpose; it does not count as a turn."""
    for call in message.get("tool_calls") or []:
        function = (call.get("function") or {}) if isinstance(call, dict) else {}
        if function.get("name") == UNKNOWN_TOOL:
            return True
        try:
            json.loads(function.get("arguments") or "{}")
        except (TypeError, ValueError):
            return True
    return False


def _turn_number(messages: list[dict[str, Any]]) -> int:
    return sum(1 for m in messages if m.get("role") == "assistant" and not _is_sabotaged(m))


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": status}}, status, headers=headers)


def _tool_call(name: str, arguments: str) -> dict[str, Any]:
    return {
        "id": f"call_{secrets.token_hex(4)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def _calls_for(scripted: list[ScriptedCall], offered: list[Any]) -> list[dict[str, Any]] | None:
    """A turn of the reference solution as tool calls of the tools offered: as they are when any of ours is
    offered (our loop; a request that names only some of them still gets the scripted calls, as before
    harnesses) or no tools are named, else written as commands for the one shell tool a harness offers
    (`shell_calls`); None when neither can be done."""
    names = {tool.get("function", {}).get("name") for tool in offered if isinstance(tool, dict)}
    if not offered or names & TOOLS.keys():
        return [_tool_call(call.name, json.dumps(call.arguments)) for call in scripted]
    shell = shell_tool(offered)
    commands = [as_shell(call.name, call.arguments) for call in scripted]
    if shell is None or None in commands:
        return None
    tool, argument = shell
    return [_tool_call(tool, json.dumps({argument: command})) for command in commands]


def _finish_calls(messages: list[dict[str, Any]], offered: list[Any]) -> list[dict[str, Any]]:
    """How to end once the solution is played: no tool call (our loop, the minimal harness), or the submit
    command a harness's prompt names, run in its shell tool (mini-swe-agent)."""
    shell = shell_tool(offered)
    prompts = [_text(m.get("content")) for m in messages if m.get("role") in ("system", "user")]
    submit = submit_command(prompts[:2])
    if shell is None or submit is None:
        return []
    return [_tool_call(shell[0], json.dumps({shell[1]: submit}))]


def _estimate_tokens(text_len: int) -> int:
    return max(1, text_len // 4)


class DemoPolicy:
    """The server's state (faults, stats, solution index) and its request handlers."""

    def __init__(self, faults: Faults | None = None, index: SolutionIndex | None = None) -> None:
        self.faults = faults.model_copy() if faults else Faults()
        self.index = index or SolutionIndex()
        self.stats = Stats()
        self.rng = random.Random(self.faults.seed)

    def set_faults(self, update: dict[str, Any]) -> Faults:
        base = {} if update.pop("reset", False) else self.faults.model_dump()
        self.faults = Faults.model_validate({**base, **update})
        if "seed" in update:
            self.rng = random.Random(self.faults.seed)
        return self.faults

    async def chat_completions(self, request: Request) -> Response:
        self.stats.total += 1
        try:
            body = await request.json()
            messages = body["messages"]
            if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
                raise TypeError("messages must be a list of objects")
        except (ValueError, KeyError, TypeError) as err:
            self.stats.by_outcome["bad_request"] += 1
            return _error(400, f"not a chat completion request: {err}", "invalid_request_error")

        prompt = next((_text(m.get("content")) for m in messages if m.get("role") == "user"), "")
        turn = _turn_number(messages)
        self.stats.record_turn(conversation_key(prompt), turn)

        if self.faults.delay_s:
            await asyncio.sleep(self.faults.delay_s)
        faults = self.faults
        if faults.fail_next or (faults.fail_rate and self.rng.random() < faults.fail_rate):
            faults.fail_next = max(0, faults.fail_next - 1)
            self.stats.by_outcome["failed"] += 1
            headers = {"Retry-After": f"{faults.retry_after:g}"} if faults.retry_after is not None else None
            return _error(faults.fail_status, "injected failure (demo policy fault injection)", "server_error", headers)
        if faults.garbage_next:
            faults.garbage_next -= 1
            self.stats.by_outcome["garbage"] += 1
            return JSONResponse({"oops": True})

        turns = self.index.lookup(prompt)
        offered = body.get("tools") if isinstance(body.get("tools"), list) else []
        if turns is None:
            outcome, content, calls = "unknown_task", "I do not know this task, so I cannot solve it.", []
        elif turn < len(turns):
            outcome, content = "tool_calls", None
            calls = _calls_for(turns[turn], offered)
            if calls is None:
                outcome, content, calls = "unknown_tools", "I cannot solve this task with the tools offered.", []
        else:
            outcome, content, calls = "final", "Done.", _finish_calls(messages, offered)

        if faults.unknown_tool_next:
            faults.unknown_tool_next -= 1
            outcome, content = "unknown_tool", None
            calls = [_tool_call(UNKNOWN_TOOL, json.dumps({"destination": "/moon"}))]
        elif faults.malformed_next and calls:
            faults.malformed_next -= 1
            outcome = "malformed"
            calls[0]["function"]["arguments"] = calls[0]["function"]["arguments"][:-1]

        self.stats.by_outcome[outcome] += 1
        return JSONResponse(self._completion(messages, content, calls))

    def _completion(self, messages: list[dict[str, Any]], content: str | None, calls: list[dict[str, Any]]) -> dict:
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if calls:
            message["tool_calls"] = calls
        prompt_chars = sum(len(_text(m.get("content"))) for m in messages)
        reply_chars = len(content or "") + sum(
            len(c["function"]["arguments"]) + len(c["function"]["name"]) for c in calls
        )
        prompt_tokens, completion_tokens = _estimate_tokens(prompt_chars), _estimate_tokens(reply_chars)
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": MODEL_ID,
            "choices": [
                {"index": 0, "message": message, "finish_reason": "tool_calls" if calls else "stop", "logprobs": None}
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }

    async def models(self, request: Request) -> Response:
        entry = {"id": MODEL_ID, "object": "model", "created": 0, "owned_by": "temporal-rollouts"}
        return JSONResponse({"object": "list", "data": [{**entry, "description": MODEL_DESCRIPTION}]})

    async def control(self, request: Request) -> Response:
        if not _from_loopback(request):
            return _error(403, "the control endpoint answers loopback callers only", "permission_error")
        if request.method == "POST":
            try:
                update = await request.json()
                if not isinstance(update, dict):
                    raise ValueError("expected a JSON object")
                self.set_faults(update)
            except (ValueError, ValidationError) as err:
                return _error(400, f"bad fault settings: {err}", "invalid_request_error")
        return JSONResponse(self.faults.model_dump())

    async def get_stats(self, request: Request) -> Response:
        return JSONResponse(self.stats.snapshot())

    async def reset_stats(self, request: Request) -> Response:
        if not _from_loopback(request):
            return _error(403, "the control endpoint answers loopback callers only", "permission_error")
        self.stats.reset()
        return JSONResponse(self.stats.snapshot())

    async def health(self, request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": MODEL_ID, "env_modules": self.index.env_modules})


def _from_loopback(request: Request) -> bool:
    host = request.client.host if request.client else ""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def build_app(
    faults: Faults | dict[str, Any] | None = None,
    *,
    enable_control: bool = False,
    allowed_hosts: AllowedHosts | None = None,
    env_modules: Sequence[str] = (),
    harbor_tasks: Sequence[str] = (),
    api_key: str | None = None,
) -> Starlette:
    """The ASGI app; `app.state.policy` is the `DemoPolicy` behind it. The admin routes
    (/control, /stats/reset) exist only with `enable_control`. Requests addressed to another host
    than `allowed_hosts` (by default those of a loopback server) are refused (`sandbox_server.http.hosts`);
    with `api_key`, every route but /health needs it (`sandbox_server.http.keys`).
    `env_modules`: modules or .py files whose envs it knows besides the bundled and installed ones;
    `harbor_tasks`: folders of Harbor tasks whose solutions it knows too."""
    if isinstance(faults, dict):
        faults = Faults.model_validate(faults)
    policy = DemoPolicy(faults, SolutionIndex(env_modules, harbor_tasks))
    routes = [
        Route("/v1/chat/completions", policy.chat_completions, methods=["POST"]),
        Route("/v1/models", policy.models, methods=["GET"]),
        Route("/stats", policy.get_stats, methods=["GET"]),
        Route("/health", policy.health, methods=["GET"]),
    ]
    if enable_control:
        routes += [
            Route("/control", policy.control, methods=["GET", "POST"]),
            Route("/stats/reset", policy.reset_stats, methods=["POST"]),
        ]
    allowed = allowed_hosts or AllowedHosts.for_bind("127.0.0.1")
    app = Starlette(
        routes=routes, middleware=[Middleware(HostGuard, allowed=allowed), Middleware(BearerKey, key=api_key)]
    )
    app.state.policy = policy
    return app


def _config(app: Starlette, log_level: str, **kwargs: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app, log_level=log_level, access_log=False, lifespan="off", backlog=4096, timeout_keep_alive=30, **kwargs
    )


async def serve(
    host: str = "127.0.0.1",
    port: int = field_default(DemoPolicySettings, "port"),
    *,
    faults: Faults | dict[str, Any] | None = None,
    log_level: str = "warning",
    enable_control: bool = False,
    allowed_hosts: Sequence[str] = (),
    env_modules: Sequence[str] = (),
    harbor_tasks: Sequence[str] = (),
    api_key: str | None = None,
) -> None:
    """Serve until cancelled, in the running event loop; answers to the names of `host` and `allowed_hosts`,
    and refuses to start beyond loopback without `api_key` (`sandbox_server.http.keys`)."""
    require_key(host, api_key, "the demo policy")
    app = build_app(
        faults,
        enable_control=enable_control,
        allowed_hosts=AllowedHosts.for_bind(host, allowed_hosts),
        env_modules=env_modules,
        harbor_tasks=harbor_tasks,
        api_key=api_key,
    )
    await uvicorn.Server(_config(app, log_level, host=host, port=port)).serve()


class BackgroundServer:
    """The demo policy served from a daemon thread, for synchronous callers and tests."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 0,
        faults: Faults | dict[str, Any] | None = None,
        *,
        enable_control: bool = False,
    ) -> None:
        self.app = build_app(faults, enable_control=enable_control, allowed_hosts=AllowedHosts.for_bind(host))
        self.policy: DemoPolicy = self.app.state.policy
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind((host, port))
        self.host, self.port = self._socket.getsockname()[:2]
        self._server = uvicorn.Server(_config(self.app, "warning"))
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [self._socket]}, name="demo-policy", daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL, ending in /v1."""
        return f"{self.url}/v1"

    def start(self, timeout_s: float = 10.0) -> BackgroundServer:
        """Start serving and wait until requests are accepted; a second call does nothing."""
        if self._thread.ident is None:
            self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the demo policy server did not start")
            time.sleep(0.01)
        return self

    def stop(self, timeout_s: float = 10.0) -> None:
        self._server.should_exit = True
        self._thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> BackgroundServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def start_in_thread(
    host: str = "127.0.0.1",
    port: int = 0,
    faults: Faults | dict[str, Any] | None = None,
    *,
    enable_control: bool = False,
) -> BackgroundServer:
    """Start the server in a daemon thread (port 0 picks a free port) and return once it accepts requests."""
    return BackgroundServer(host, port, faults, enable_control=enable_control).start()


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m temporal_rollouts.policy_servers.demo",
        description="Serve the demo policy (a test fixture that replays reference solutions; not a model).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=field_default(DemoPolicySettings, "port"))
    parser.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        help="another name this server is reached by (repeatable; '.example.com' for subdomains)",
    )
    parser.add_argument(
        "--enable-control",
        action="store_true",
        help="Serve the test-only admin endpoints /control and /stats/reset (loopback hosts only).",
    )
    parser.add_argument(
        "--env-module",
        action="append",
        default=[],
        dest="env_modules",
        metavar="MODULE",
        help="know the tasks of this module's envs too (a module name or a .py file; repeatable)",
    )
    parser.add_argument(
        "--harbor-tasks",
        action="append",
        default=[],
        dest="harbor_tasks",
        metavar="PATH",
        help="know the solutions of this folder of Harbor tasks too (an absolute path; repeatable)",
    )
    add_key_argument(parser)
    for name, field in Faults.model_fields.items():
        kind = float if field.annotation in (float, float | None) else int
        flag = f"--{name.replace('_', '-')}"
        parser.add_argument(flag, type=kind, default=field.default, dest=name, help=field.description)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    try:
        faults = Faults.model_validate({name: getattr(args, name) for name in Faults.model_fields})
    except ValidationError as err:
        raise SystemExit(f"bad fault flags: {err}") from None
    if args.enable_control and not is_loopback_bind(args.host):
        raise SystemExit(f"--enable-control needs a loopback --host (127.0.0.1, ::1, localhost), not {args.host!r}")
    api_key = key_from_env(args.api_key_env)
    require_key(args.host, api_key, "the demo policy")
    logging.basicConfig(level=args.log_level.upper())
    print(f"demo policy (not a model) on http://{args.host}:{args.port}/v1", file=sys.stderr, flush=True)
    try:
        asyncio.run(
            serve(
                args.host,
                args.port,
                faults=faults,
                log_level=args.log_level,
                enable_control=args.enable_control,
                allowed_hosts=args.allowed_hosts,
                env_modules=args.env_modules,
                harbor_tasks=args.harbor_tasks,
                api_key=api_key,
            )
        )
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
