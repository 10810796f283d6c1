"""`sandbox.backend` as a tagged union, the flat settings it replaced, and tokens from the pool secret."""

from __future__ import annotations

import pytest

from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.sandbox_backends import (
    LocalBackendConfig,
    ModalBackendConfig,
    NomadBackendConfig,
    StaticBackendConfig,
)
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.sandbox.backends.tokens import PoolSecret, derive_token


def test_each_type_picks_its_config_and_refuses_other_backends_fields() -> None:
    assert isinstance(Settings().sandbox.backend, LocalBackendConfig)
    kinds = {"nomad": NomadBackendConfig, "modal": ModalBackendConfig}
    for kind, config in kinds.items():
        assert isinstance(Settings(sandbox={"backend": {"type": kind}}).sandbox.backend, config)
    static = Settings(sandbox={"backend": {"type": "static", "servers": [{"container_id": "a", "url": "http://h:1"}]}})
    assert isinstance(static.sandbox.backend, StaticBackendConfig) and not static.sandbox.start_containers
    with pytest.raises(ConfigError, match="app_name"):
        Settings(sandbox={"backend": {"type": "nomad", "app_name": "x"}})
    with pytest.raises(ConfigError, match="kubernetes"):
        Settings(sandbox={"backend": {"type": "kubernetes"}})
    with pytest.raises(ConfigError, match="servers"):
        Settings(sandbox={"backend": {"type": "static", "servers": []}})


def test_every_backend_field_is_documented() -> None:
    for config in (LocalBackendConfig, StaticBackendConfig, NomadBackendConfig, ModalBackendConfig):
        source = __import__("inspect").getsource(config)
        for name in config.model_fields:
            assert f"{name}:" in source and '"""' in source.split(f"    {name}:", 1)[1].split("\n", 2)[1], name


def test_flat_local_settings_still_work_and_move_into_the_local_backend(monkeypatch) -> None:
    settings = Settings(sandbox={"backend": "local", "host": "127.0.0.5", "start_local": False})
    assert settings.sandbox.backend == LocalBackendConfig(host="127.0.0.5", start_containers=False)
    monkeypatch.setenv("ROLLOUTS_SANDBOX__BACKEND__TYPE", "nomad")
    monkeypatch.setenv("ROLLOUTS_SANDBOX__BACKEND__DATACENTER", "dc7")
    assert Settings().sandbox.backend.datacenter == "dc7"
    with pytest.raises(ConfigError, match="belong to the local backend"):
        Settings(sandbox={"host": "x"})


def test_modal_idle_timeout_must_outlast_a_lease() -> None:
    with pytest.raises(ConfigError, match="must exceed sandbox.lease_ttl_s"):
        Settings(sandbox={"lease_ttl_s": 600, "backend": {"type": "modal", "idle_timeout_s": 120}})
    Settings(sandbox={"lease_ttl_s": 600, "backend": {"type": "modal", "idle_timeout_s": 900}})


def test_tokens_are_per_container_and_need_the_secret(monkeypatch) -> None:
    secret = "s" * 32
    assert derive_token(secret, "a") == derive_token(secret, "a") != derive_token(secret, "b")
    assert derive_token(secret, "a") != derive_token("t" * 32, "a")
    monkeypatch.delenv("UNSET_POOL_SECRET", raising=False)
    with pytest.raises(ConfigError, match=r"\$UNSET_POOL_SECRET, which is not set"):
        PoolSecret.from_env("UNSET_POOL_SECRET")
    monkeypatch.setenv("SHORT_POOL_SECRET", "abc")
    with pytest.raises(ConfigError, match="at least 16"):
        PoolSecret.from_env("SHORT_POOL_SECRET")
    monkeypatch.setenv("GOOD_POOL_SECRET", secret)
    pool_secret = PoolSecret.from_env("GOOD_POOL_SECRET")
    assert pool_secret.token("a") == derive_token(secret, "a") and secret not in repr(pool_secret)
