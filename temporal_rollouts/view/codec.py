"""A remote codec endpoint for the Temporal UI: payloads stored by reference, shown as content.

Large payloads travel through the SDK's ExternalStorage (storage/converter.py), so the UI
shows a workflow's big inputs and results as storage references. Pointed at this
endpoint (UI settings, "Codec Server": `http://127.0.0.1:8300/codec`), the UI posts those
payloads to `/codec/decode` and shows what they stand for, read from the object store.
It speaks the UI's codec protocol: `{"payloads": [Payload as proto JSON]}` in and out.

Reading a reference goes through the SDK's own ExternalStorage retrieval, a private
method (`_retrieve_payload_sequence`) as the SDK exposes no public one (its storage API is
marked experimental); pinned by tests/integration/test_view_codec.py.
"""

from __future__ import annotations

from google.protobuf import json_format
from starlette.requests import Request
from starlette.responses import JSONResponse
from temporalio.api.common.v1 import Payload
from temporalio.converter import DataConverter

MAX_PAYLOADS = 100
"""Payloads one request may ask for; the UI sends a handful at a time."""


def codec_routes(converter: DataConverter):
    storage = converter.external_storage

    async def decode(request: Request) -> JSONResponse:
        body = await request.json()
        raw = body.get("payloads") if isinstance(body, dict) else None
        if not isinstance(raw, list) or len(raw) > MAX_PAYLOADS:
            return JSONResponse(
                {"error": f"expected {{'payloads': [...]}} with at most {MAX_PAYLOADS}"}, status_code=400
            )
        payloads = [json_format.ParseDict(item, Payload()) for item in raw]
        if storage is not None:
            payloads = list(await storage._retrieve_payload_sequence(payloads))
        return JSONResponse({"payloads": [json_format.MessageToDict(p) for p in payloads]})

    async def encode(request: Request) -> JSONResponse:  # the UI may ask; references stay as they are
        body = await request.json()
        return JSONResponse({"payloads": body.get("payloads", []) if isinstance(body, dict) else []})

    return decode, encode
