"""One model sampled token by token, one request at a time, with weights that can be
replaced between requests.

What the numbers mean:

- Each reported logprob is the log-softmax of the model's raw logits at temperature 1
  for the sampled token, whatever the request's temperature, top_p or top_k: what one
  fresh forward pass over prompt + output gives (`smollm2.forward_logprobs`), which is
  what a trainer recomputes. vLLM's default (`logprobs_mode="raw_logprobs"`) and
  SGLang's default (no `temp_scaled_logprobs`) report the same.
- Sampling draws from softmax(logits / temperature) after top-k and top-p filtering;
  temperature 0 is greedy. A request's `seed` makes it repeatable.
- Stopping follows SGLang's `Req.check_finished` order: max tokens first (so an EOS
  drawn as the last allowed token reports "length"), then a stop token (the tokenizer's
  EOS, `<|im_end|>`, the model's EOS ids, the request's `stop_token_ids`; not with
  `ignore_eos`), then stop strings. The stop token IS in the output ids, with its
  logprob, as in both servers; only the text leaves it out (special tokens are skipped
  by default) and is cut before a matched stop string.

Like SGLang's radix cache, but with one entry: the KV cache of the previous prompt is
kept, and a request whose prompt starts the same way (the rollouts of one group share
their whole prompt) computes only the rest; `cached_tokens` says how many it reused.

Weight updates follow SGLang's `update_weights_from_disk`: one lock covers a whole
request (all of its `n` samples) and a whole update, so an update waits for the
request in flight, requests that arrive during the load wait for it, and no request
is ever served by two versions. The version that served a request is returned with it.
"""

from __future__ import annotations

import copy
import math
import threading
import time
from typing import Any
from dataclasses import dataclass, field
from pathlib import Path

import torch

from temporal_rollouts.policy_servers.weights import load_into, read_state_dict

DEFAULT_WEIGHT_VERSION = "default"
"""SGLang's version before any update (`--weight-version`)."""


DEFAULT_MAX_NEW_TOKENS = 128
"""The most tokens one request samples unless the server is started with another cap (SGLang's own
default for a request that names none): a CPU samples a few to a few dozen tokens a second, and a
client that asks for its whole context budget (thousands) would hold a rollout for minutes to hours."""


class BadRequest(ValueError):
    """A request this server cannot serve: answered with 400 and the message."""


class Stopping(RuntimeError):
    """The server is shutting down: the request in flight ends between two tokens (answered with 503)."""


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
    cached_tokens: int = 0


class TokenSampler:
    """One model, one request at a time, sampled token by token over a KV cache."""

    model: Any
    tokenizer: Any
    model_path: str
    """Where the weights being served came from."""
    weight_version: str
    """The version those weights were loaded as (SGLang's `weight_version`)."""
    busy_s: float = 0.0
    """Seconds spent generating since the server started (`/get_model_info`): how busy it kept."""
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS
    """The most tokens a request samples, whatever it asks for (0: no cap); a capped request ends with
    finish reason "length", as one that asked for that many."""

    def __init__(self, model, tokenizer, model_path: str, weight_version: str = DEFAULT_WEIGHT_VERSION) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.model_path = model_path
        self.weight_version = weight_version
        self.lock = threading.Lock()
        self.stopping = threading.Event()
        self._last_prompt: tuple[list[int], Any] | None = None
        """The previous prompt's ids and its KV cache, computed by the weights now served."""
        self.vocab_size = model.config.vocab_size
        self.context = getattr(model.config, "max_position_embeddings", None) or 2**31
        eos = {tokenizer.eos_token_id, tokenizer.convert_tokens_to_ids("<|im_end|>")}
        model_eos = model.generation_config.eos_token_id
        eos.update(model_eos if isinstance(model_eos, list) else [model_eos])
        self.eos_ids = {i for i in eos if isinstance(i, int) and 0 <= i < self.vocab_size}

    def check(self, req: SamplingRequest) -> None:
        if not req.input_ids:
            raise BadRequest("input_ids must be a non-empty list of token ids")
        bad = [
            t for t in req.input_ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size
        ]
        if bad:
            raise BadRequest(f"token ids out of the vocabulary [0, {self.vocab_size}): {bad[:5]}")
        if len(req.input_ids) >= self.context:
            raise BadRequest(f"prompt of {len(req.input_ids)} tokens does not fit the context of {self.context}")

    def generate(self, req: SamplingRequest) -> tuple[list[Sample], str]:
        """The request's samples and the weight version that made every one of them."""
        self.check(req)
        if self.max_new_tokens:
            req.max_new_tokens = min(req.max_new_tokens, self.max_new_tokens)
        with self.lock, torch.inference_mode():
            started = time.monotonic()
            generator = torch.Generator()
            if req.seed is None:
                generator.seed()
            else:
                generator.manual_seed(req.seed)
            try:
                return [self._sample_one(req, generator) for _ in range(req.n)], self.weight_version
            finally:
                self.busy_s += time.monotonic() - started

    def stop(self) -> None:
        """End the request in flight before its next token, and refuse the ones after it (shutdown)."""
        self.stopping.set()

    def update_weights(self, model_path: str, weight_version: str | None) -> None:
        """Serve the weights saved at `model_path` from the next request on; a bad checkpoint
        raises `WeightsError` and leaves the served weights as they were."""
        with self.lock:
            load_into(self.model, read_state_dict(Path(model_path)))
            self._last_prompt = None
            self.model_path = model_path
            if weight_version is not None:
                self.weight_version = weight_version

    def _prompt_cache(self, input_ids: list[int]) -> tuple[Any, int]:
        """A KV cache of the longest prefix `input_ids` shares with the previous prompt (never
        the whole prompt: its last token must run to give the first logits), and its length."""
        from transformers import DynamicCache

        if self._last_prompt is None:
            return DynamicCache(config=self.model.config), 0
        previous, cache = self._last_prompt
        shared = 0
        for mine, theirs in zip(input_ids[:-1], previous):
            if mine != theirs:
                break
            shared += 1
        if shared == 0:
            return DynamicCache(config=self.model.config), 0
        cache = copy.deepcopy(cache)
        if cache.get_seq_length() > shared:
            cache.crop(shared - cache.get_seq_length())  # negative: tokens to drop, in every transformers version
        return cache, shared

    def _sample_one(self, req: SamplingRequest, generator: torch.Generator) -> Sample:
        limit = min(req.max_new_tokens, self.context - len(req.input_ids))
        stop_ids = set(req.stop_token_ids) | (set() if req.ignore_eos else self.eos_ids)
        output_ids: list[int] = []
        logprobs: list[float] = []
        tops: list[list[tuple[int, float]]] = []
        finish_type, matched = "length", None
        cache, cached = self._prompt_cache(req.input_ids)
        step_input = torch.tensor([req.input_ids[cached:]])
        while len(output_ids) < limit:
            if self.stopping.is_set():
                raise Stopping("the server is shutting down")
            out = self.model(input_ids=step_input, past_key_values=cache, use_cache=True)
            cache = out.past_key_values
            if not output_ids:
                self._last_prompt = (req.input_ids, copy.deepcopy(cache))
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
        return Sample(output_ids, logprobs, tops, finish_type, matched, text, cached)

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
