"""How the Temporal client is built for a real cluster: TLS, mTLS, API key by env-var name, namespace.
No TLS server is needed: `Client.connect` is replaced by a recorder at the transport seam."""

from __future__ import annotations

import pytest
from temporalio.service import TLSConfig

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime import temporal


@pytest.fixture
def recorded(monkeypatch) -> list[tuple[str, dict]]:
    calls: list[tuple[str, dict]] = []

    async def fake_connect(target_host: str, **kwargs: object) -> object:
        calls.append((target_host, kwargs))
        return object()

    monkeypatch.setattr(temporal.Client, "connect", fake_connect)
    return calls


async def test_mtls_api_key_and_namespace_reach_the_client(tmp_path, monkeypatch, recorded) -> None:
    for name in ("ca.pem", "client.pem", "client.key"):
        (tmp_path / name).write_bytes(f"-----{name}-----".encode())
    monkeypatch.setenv("TEST_TEMPORAL_KEY", "key-123")
    settings = Settings(
        data_dir=tmp_path / "data",
        temporal={
            "address": "rl.tmprl.cloud:7233",
            "namespace": "rl.acct",
            "tls_ca_file": tmp_path / "ca.pem",
            "tls_client_cert_file": tmp_path / "client.pem",
            "tls_client_key_file": tmp_path / "client.key",
            "tls_server_name": "rl.internal",
            "api_key_env": "TEST_TEMPORAL_KEY",
        },
        worker={"host_name": "gpu-node-7"},
    )
    await temporal.connect(settings, start_embedded=False)
    [(target, kwargs)] = recorded
    assert target == "rl.tmprl.cloud:7233" and kwargs["namespace"] == "rl.acct" and kwargs["api_key"] == "key-123"
    assert kwargs["tls"] == TLSConfig(
        server_root_ca_cert=b"-----ca.pem-----",
        client_cert=b"-----client.pem-----",
        client_private_key=b"-----client.key-----",
        domain="rl.internal",
    )
    assert kwargs["identity"].endswith("@gpu-node-7")
    assert "key-123" not in repr(settings)


async def test_plain_connection_has_no_tls_and_an_api_key_alone_turns_tls_on(tmp_path, monkeypatch, recorded) -> None:
    await temporal.connect(Settings(data_dir=tmp_path, temporal={"address": "t:7233"}), start_embedded=False)
    assert "tls" not in recorded[-1][1] and "api_key" not in recorded[-1][1]
    monkeypatch.setenv("TEST_TEMPORAL_KEY", "k")
    await temporal.connect(
        Settings(data_dir=tmp_path, temporal={"address": "t:7233", "api_key_env": "TEST_TEMPORAL_KEY"}),
        start_embedded=False,
    )
    assert recorded[-1][1]["tls"] == TLSConfig()


def test_bad_tls_input_gets_a_clear_error(tmp_path, monkeypatch) -> None:
    with pytest.raises(ConfigError, match="go together"):
        Settings(temporal={"address": "t:7233", "tls_client_cert_file": tmp_path / "c.pem"})
    with pytest.raises(ConfigError, match="cannot read Temporal TLS file"):
        temporal.connect_options(Settings(temporal={"address": "t:7233", "tls_ca_file": tmp_path / "missing.pem"}))
    monkeypatch.delenv("UNSET_KEY", raising=False)
    with pytest.raises(ConfigError, match=r"\$UNSET_KEY"):
        temporal.connect_options(Settings(temporal={"address": "t:7233", "api_key_env": "UNSET_KEY"}))
