"""The aiohttp session helpers: proxies from the environment, looked up once per host."""

from __future__ import annotations

import pytest

from temporal_rollouts.core import http_session


@pytest.fixture(autouse=True)
def fresh_lookups():
    http_session.proxy_for.cache_clear()
    yield
    http_session.proxy_for.cache_clear()


def test_the_environment_names_the_proxy_and_no_proxy_bypasses_it(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    monkeypatch.setenv("NO_PROXY", "sandbox.internal,10.0.0.5")
    assert http_session.proxy_of("https://api.example.com/v1/chat") == "http://proxy.internal:3128"
    assert http_session.proxy_of("https://sandbox.internal:8080/exec") is None
    assert http_session.proxy_of("http://10.0.0.5:9000/health") is None
    assert http_session.proxy_of("http://api.example.com/") is None  # no HTTP_PROXY set


def test_no_proxy_variables_means_direct(monkeypatch):
    for name in ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    assert http_session.proxy_of("https://api.example.com/v1") is None
