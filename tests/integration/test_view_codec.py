"""The codec endpoint of `rollouts view`: a batch input too large for history is stored by
reference (ExternalStorage over the object store); posted as the Temporal UI posts it, the
reference comes back as the original JSON. Real dev server, real object store, real HTTP."""

from __future__ import annotations

import base64
import json

import pytest
from google.protobuf import json_format
from starlette.testclient import TestClient
from temporalio.client import Client

from temporal_rollouts.core.records import BatchInput
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.storage.transcripts import TranscriptStore
from temporal_rollouts.view.app import create_app
from tests.support.waiting import batch_id
from workflows.batch import BatchWorkflow

pytestmark = pytest.mark.slow

UI = "http://127.0.0.1:8233"


async def test_the_ui_can_expand_a_stored_reference(
    project_client: Client, settings: Settings, transcripts: TranscriptStore
) -> None:
    big = "x" * (settings.storage.payload_size_threshold * 2)
    handle = await project_client.start_workflow(  # no worker takes this task queue: only the input matters
        BatchWorkflow.run,
        BatchInput(env="echo_chain", env_config={"note": big}),
        id=batch_id("codec"),
        task_queue="codec-test-no-worker",
    )
    try:
        history = await handle.fetch_history()
        [stored] = history.events[0].workflow_execution_started_event_attributes.input.payloads
        assert big.encode() not in stored.data  # history holds a reference, not the input
        posted = {"payloads": [json_format.MessageToDict(stored)]}

        with TestClient(create_app(project_client, transcripts, [UI]), base_url="http://127.0.0.1:8300") as http:
            answer = http.post("/codec/decode", json=posted, headers={"Origin": UI, "X-Namespace": "default"})
            preflight = http.options(
                "/codec/decode",
                headers={
                    "Origin": UI,
                    "Access-Control-Request-Method": "POST",
                    "Access-Control-Request-Headers": "content-type,x-namespace",
                },
            )
            refused = http.post("/codec/decode", json={"nope": 1})
            rebound = http.post("/codec/decode", json=posted, headers={"Host": "attacker.example:8300"})
        assert answer.status_code == 200 and answer.headers["access-control-allow-origin"] == UI
        [payload] = answer.json()["payloads"]
        value = json.loads(base64.b64decode(payload["data"]))
        assert value["env"] == "echo_chain" and value["env_config"]["note"] == big
        assert base64.b64decode(payload["metadata"]["encoding"]) == b"json/plain"
        assert preflight.status_code == 200
        assert refused.status_code == 400
        assert rebound.status_code == 421 and "x" * 100 not in rebound.text  # a DNS-rebinding page reads nothing
    finally:
        await handle.terminate("test over")
