"""S3 addressing style: a custom endpoint (MinIO by its compose host name) gets path-style URLs,
since boto's "auto" would put the bucket into the host name (`rollouts.minio`), which does not
resolve. Checked on the boto client our store really opens, through the URLs it signs (no network)."""

from __future__ import annotations

import pytest

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.storage.objects import S3ObjectClient, object_client

pytest.importorskip("aioboto3")


async def signed_url(client: S3ObjectClient) -> str:
    await client._open()
    try:
        assert client._s3.meta.config.s3["addressing_style"] == client.addressing_style
        return await client._s3.generate_presigned_url("get_object", Params={"Bucket": "rollouts", "Key": "a/b"})
    finally:
        await client.aclose()


@pytest.fixture(autouse=True)
def credentials(monkeypatch) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "test")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "test")


async def test_a_custom_endpoint_defaults_to_path_style(tmp_path) -> None:
    settings = Settings(
        data_dir=tmp_path, storage={"type": "s3", "endpoint_url": "http://minio:9000", "region": "us-east-1"}
    )
    client = object_client(settings)
    assert isinstance(client, S3ObjectClient) and client.addressing_style == "path"
    assert (await signed_url(client)).startswith("http://minio:9000/rollouts/a/b?")


async def test_the_configured_style_wins(tmp_path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        storage={
            "type": "s3",
            "endpoint_url": "http://minio:9000",
            "region": "us-east-1",
            "s3_addressing_style": "virtual",
        },
    )
    assert (await signed_url(object_client(settings))).startswith("http://rollouts.minio:9000/a/b?")


async def test_aws_keeps_boto_auto(tmp_path) -> None:
    client = object_client(Settings(data_dir=tmp_path, storage={"type": "s3", "region": "us-east-1"}))
    assert client.addressing_style == "auto"
    assert (await signed_url(client)).startswith("https://rollouts.s3.amazonaws.com/a/b?")


def test_an_unknown_style_is_refused(tmp_path) -> None:
    with pytest.raises(ConfigError, match="s3_addressing_style"):
        Settings(data_dir=tmp_path, storage={"type": "s3", "s3_addressing_style": "dotted"})


def test_the_style_is_read_from_the_environment(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ROLLOUTS_STORAGE__S3_ADDRESSING_STYLE", "path")
    assert Settings(data_dir=tmp_path).storage.s3_addressing_style == "path"
