"""Token-in, token-out generation: SGLang's native `/generate` or the Atropos vLLM shape.

The caller sends token ids it rendered itself and gets back exactly the ids the model
sampled with the model's logprob of each, so nothing is re-tokenized between what the
model wrote and what a trainer learns from. One call is one HTTP request; Temporal owns
retries (see `llm.http_status`).
"""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
from pydantic import BaseModel

from temporal_rollouts.core.errors import MalformedModelReply
from temporal_rollouts.llm.http_status import error_snippet
from temporal_rollouts.llm.transport import model_http_client, post_json

GenerateApi = Literal["sglang", "vllm"]


class Generation(BaseModel):
    ids: list[int]
    logprobs: list[float]
    finish_reason: Literal["stop", "length"]
    weight_version: str | None = None
    """The server's label of the weights that sampled every one of `ids` (SGLang's
    `meta_info.weight_version`); None from a server that reports none."""


class GenerateClient:
    def __init__(
        self,
        base_url: str,
        api: GenerateApi,
        api_key: str | None = None,
        timeout_s: float = 300.0,
        *,
        transport: httpx.AsyncBaseTransport | None = None,
        max_connections: int | None = 256,
    ) -> None:
        # /generate lives at the server root, beside (not under) the OpenAI /v1 routes.
        root = base_url.rstrip("/").removesuffix("/v1")
        self.api = api
        self._secrets = (api_key,) if api_key else ()
        self._http = model_http_client(root, api_key, timeout_s, transport=transport, max_connections=max_connections)

    async def aclose(self) -> None:
        await self._http.aclose()

    async def served_version(self) -> str | None:
        """The label of the weights the server serves now (SGLang's `/get_model_info` `weight_version`,
        which the CPU policy server reports too); None where it cannot say (no such route, an error)."""
        try:
            response = await self._http.get("/get_model_info", timeout=10.0)
            version = response.json().get("weight_version") if response.status_code == 200 else None
        except (httpx.HTTPError, ValueError, AttributeError):
            return None
        return None if version is None else str(version)

    async def generate(
        self,
        input_ids: list[int],
        *,
        max_tokens: int,
        temperature: float,
        stop_token_ids: list[int],
        top_p: float = 1.0,
    ) -> Generation:
        if self.api == "sglang":
            body: dict[str, Any] = {
                "input_ids": input_ids,
                "sampling_params": {
                    "max_new_tokens": max_tokens,
                    "temperature": temperature,
                    "top_p": top_p,
                    "stop_token_ids": stop_token_ids,
                },
                "return_logprob": True,
            }
        else:
            body = {
                "prompt": {"prompt_token_ids": input_ids},
                "logprobs": 0,
                "n": 1,
                "max_tokens": max_tokens,
                "temperature": temperature,
                "top_p": top_p,
                "stop_token_ids": stop_token_ids,
            }
        response = await post_json(self._http, "/generate", body, secrets=self._secrets)
        read = _read_sglang if self.api == "sglang" else _read_vllm
        try:
            data = json.loads(response.content)
            ids, logprobs, finish = read(data)
            version = _weight_version(data)
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            snippet = error_snippet(response.content, secrets=self._secrets)
            raise MalformedModelReply(
                f"/generate reply is not the {self.api} shape ({type(exc).__name__}: {exc}); body: {snippet}",
                status_code=response.status_code,
            ) from None
        if len(ids) != len(logprobs):
            raise MalformedModelReply(f"/generate returned {len(ids)} tokens but {len(logprobs)} logprobs")
        return Generation(
            ids=ids, logprobs=logprobs, finish_reason="length" if finish == "length" else "stop", weight_version=version
        )


def _read_sglang(data: Any) -> tuple[list[int], list[float], str]:
    """meta_info.output_token_logprobs holds (logprob, token_id, text) per generated token."""
    if isinstance(data, list):
        data = data[0]
    meta = data["meta_info"]
    pairs = meta["output_token_logprobs"]
    finish = meta.get("finish_reason")
    kind = finish.get("type") if isinstance(finish, dict) else finish
    return [int(p[1]) for p in pairs], [float(p[0]) for p in pairs], str(kind)


def _weight_version(data: Any) -> str | None:
    """SGLang puts it in `meta_info`; our CPU server adds it at the top of the vLLM shape."""
    first = data[0] if isinstance(data, list) else data
    version = (first.get("meta_info") or {}).get("weight_version", first.get("weight_version"))
    return None if version is None else str(version)


def _read_vllm(data: Any) -> tuple[list[int], list[float], str]:
    """logprobs[completion][position] is a list whose first entry maps the sampled id to its logprob."""
    positions = data["logprobs"][0]
    ids: list[int] = []
    logprobs: list[float] = []
    for entry in positions:
        ((token, logprob),) = entry[0].items()
        ids.append(int(token))
        logprobs.append(float(logprob))
    return ids, logprobs, str(data["finish_reasons"][0])
