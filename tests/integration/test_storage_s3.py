"""The S3 store path (`storage.type = "s3"`) against a real S3-compatible HTTP server.

MinIO does not install from the package registries these machines reach; moto's server
(`moto_server`, from PyPI) speaks the same S3 HTTP API and runs as its own process here.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from temporalio.api.common.v1 import Payload

from temporal_rollouts.core.messages import Message, ToolSpec
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.storage.converter import data_converter
from temporal_rollouts.storage.objects import S3ObjectClient, object_client
from temporal_rollouts.storage.transcripts import TranscriptStore
from tests.support.servers.process import HOST, LoopbackServer

BUCKET = "rollouts"


@pytest.fixture(scope="module")
def s3_endpoint(tmp_path_factory) -> Iterator[str]:
    moto = shutil.which("moto_server")
    if moto is None:
        pytest.skip("moto_server is not installed")
    server = LoopbackServer(tmp_path_factory.mktemp("s3") / "moto_server.log")
    server.what = "moto_server"
    server.launch([moto, "-H", HOST, "-p", str(server.port)])
    server.wait_ready()
    yield server.url
    server.stop()


@pytest.fixture
async def s3(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch, tmp_path) -> S3ObjectClient:
    for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test"}.items():
        monkeypatch.setenv(name, value)
    settings = Settings(
        data_dir=tmp_path, storage={"type": "s3", "endpoint_url": s3_endpoint, "region": "us-east-1", "bucket": BUCKET}
    )
    import aioboto3

    async with aioboto3.Session().client("s3", endpoint_url=s3_endpoint, region_name="us-east-1") as admin:
        await admin.create_bucket(Bucket=BUCKET)
    client = object_client(settings)
    assert isinstance(client, S3ObjectClient)
    yield client
    await client.aclose()


async def test_transcripts_round_trip_through_s3(s3: S3ObjectClient) -> None:
    store = TranscriptStore(s3, BUCKET)
    tools = [ToolSpec(name="terminal", description="run", parameters={"type": "object"})]
    ref = await store.start([Message(role="user", content="hi")], tools)
    ref = await store.append(ref, [Message(role="assistant", content="x" * 20_000)])

    fresh = TranscriptStore(s3, BUCKET)  # another worker: nothing cached
    messages = await fresh.load(ref)
    assert [m.role for m in messages] == ["user", "assistant"] and len(messages[1].content) == 20_000
    assert [t.name for t in await fresh.offered_tools(ref)] == ["terminal"]


async def assert_by_reference(settings: Settings, objects) -> None:
    converter = data_converter(settings, objects)
    big, small = {"log": "y" * 100_000}, {"n": 1}
    [encoded_big, encoded_small] = await converter.encode([big, small])
    assert isinstance(encoded_big, Payload) and encoded_big.ByteSize() < 2_000, "history holds a reference"
    assert b'"n":1' in encoded_small.data, "small payloads stay inline"
    assert await converter.decode([encoded_big, encoded_small], [dict, dict]) == [big, small]


async def test_large_payloads_travel_by_reference_through_s3(s3: S3ObjectClient, tmp_path, s3_endpoint) -> None:
    settings = Settings(data_dir=tmp_path, storage={"type": "s3", "endpoint_url": s3_endpoint, "bucket": BUCKET})
    await assert_by_reference(settings, s3)


async def test_large_payloads_travel_by_reference_through_the_local_folder(tmp_path) -> None:
    settings = Settings(data_dir=tmp_path)
    await assert_by_reference(settings, object_client(settings))
    assert list((tmp_path / "storage").rglob("*")), "the payload was written under the data folder"


@pytest.mark.parametrize("store", ["s3", "local"])
async def test_snapshot_files_stream_in_and_out_of_either_store(store, s3: S3ObjectClient, tmp_path) -> None:
    import os

    from temporal_rollouts.storage.objects import LocalObjectClient, object_from_file, object_to_file

    objects = s3 if store == "s3" else LocalObjectClient(tmp_path / "objects")
    source = tmp_path / "snapshot.tar.gz"
    source.write_bytes(os.urandom(12 * 1024 * 1024 + 17))  # more than one multipart part
    await object_from_file(objects, bucket=BUCKET, key="snapshots/a/b.tar.gz", path=source)
    back = tmp_path / "back.tar.gz"
    await object_to_file(objects, bucket=BUCKET, key="snapshots/a/b.tar.gz", path=back)
    assert back.read_bytes() == source.read_bytes()
    assert await objects.get_object(bucket=BUCKET, key="snapshots/a/b.tar.gz") == source.read_bytes()
