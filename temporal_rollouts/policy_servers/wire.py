"""The two `/generate` wire shapes this server speaks on one route, chosen by the body.

- SGLang: `{"input_ids": [...], "sampling_params": {...}, "return_logprob": true}` ->
  `{"text", "output_ids", "meta_info": {"prompt_tokens", "completion_tokens", "weight_version",
  "finish_reason": {"type": "stop", "matched": id_or_str} | {"type": "length", "length": N},
  "output_token_logprobs": [[logprob, token_id, null], ...]}}` (a list of those when n > 1).
- vLLM (Atropos' example_trainer/vllm_api_server.py): `{"prompt": {"prompt_token_ids": [...]},
  "logprobs": 0, "max_tokens": N, ...}` -> `{"text": [...], "finish_reasons": [...],
  "logprobs": [[[{"<token_id>": logprob}], ...]], "token_ids": [[...]], "prompt_token_ids",
  "weight_version"}`. That server reports no version; ours adds it at the top level, the one
  place a reader of that shape can find it without anything else moving.

A field this server cannot honour is a 400 naming it, never silently ignored.
"""

from __future__ import annotations

import uuid
from typing import Any

from temporal_rollouts.policy_servers.sampling import BadRequest, Sample, SamplingRequest

_NEUTRAL = {"min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0, "repetition_penalty": 1.0}
# sampling fields both wire shapes spell alike
_SHARED = {"temperature", "top_p", "top_k", "stop", "stop_token_ids", "ignore_eos", "skip_special_tokens", "n", "seed"}
_SGLANG_PARAMS = {"max_new_tokens", "sampling_seed", "no_stop_trim", *_SHARED, *_NEUTRAL}
_VLLM_FIELDS = {"prompt", "max_tokens", "logprobs", "stream", "model", *_SHARED, *_NEUTRAL}


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
            raise BadRequest(f"{key} is not supported by this server (only {neutral})")
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
        raise BadRequest(f"batched {what} (a list of lists) is not supported by this server")
    return value


def parse_sglang(body: dict, tokenizer) -> SamplingRequest:
    if body.get("stream"):
        raise BadRequest("stream is not supported by this server")
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
        raise BadRequest("stream is not supported by this server")
    prompt = body["prompt"]
    if isinstance(prompt, dict) and "prompt_token_ids" in prompt:
        input_ids = _token_ids(prompt["prompt_token_ids"], "prompt.prompt_token_ids")
    elif isinstance(prompt, str) and prompt:
        input_ids = tokenizer.encode(prompt, add_special_tokens=False)
    else:
        raise BadRequest('prompt must be {"prompt_token_ids": [...]} or a non-empty string')
    req = _common(body, input_ids, "max_tokens", 16)
    if body.get("logprobs") is not None:
        req.top_logprobs = _number(body, "logprobs", 0, int, low=0, high=20)
    return req


def sglang_response(req: SamplingRequest, samples: list[Sample], version: str, body: dict, tokenizer, elapsed_s: float):
    with_text = bool(body.get("return_text_in_logprobs"))

    def entry(logprob: float, token: int) -> list:
        return [logprob, token, tokenizer.decode([token]) if with_text else None]

    results = []
    for sample in samples:
        finish = (
            {"type": "stop", "matched": sample.matched}
            if sample.finish_type == "stop"
            else {"type": "length", "length": req.max_new_tokens}
        )
        meta = {
            "id": uuid.uuid4().hex,
            "prompt_tokens": len(req.input_ids),
            "completion_tokens": len(sample.output_ids),
            "cached_tokens": sample.cached_tokens,
            "weight_version": version,
            "finish_reason": finish,
            "e2e_latency": elapsed_s,
        }
        if body.get("return_logprob"):
            meta["output_token_logprobs"] = [entry(lp, t) for lp, t in zip(sample.logprobs, sample.output_ids)]
            if req.top_logprobs:
                meta["output_top_logprobs"] = [[entry(lp, t) for t, lp in top] for top in sample.top_logprobs]
        results.append({"text": sample.text, "output_ids": sample.output_ids, "meta_info": meta})
    return results[0] if req.n == 1 else results


def vllm_response(req: SamplingRequest, samples: list[Sample], version: str, body: dict, tokenizer) -> dict:
    response = {
        "weight_version": version,
        "text": [s.text for s in samples],
        "prompt": tokenizer.decode(req.input_ids),
        "finish_reasons": [s.finish_type for s in samples],
    }
    if body.get("logprobs") is not None:
        # The sampled token first in each dict: Atropos reads the first key as the token id.
        response["logprobs"] = [
            [
                [{str(t): lp, **{str(i): v for i, v in top if i != t}}]
                for t, lp, top in zip(s.output_ids, s.logprobs, s.top_logprobs or [[]] * len(s.output_ids))
            ]
            for s in samples
        ]
        response["prompt_token_ids"] = req.input_ids
        response["token_ids"] = [s.output_ids for s in samples]
    return response
