"""Servers answer only to their own names: the DNS-rebinding defence of every HTTP endpoint."""

from __future__ import annotations

import socket

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from temporal_rollouts.sandbox_server.http.hosts import AllowedHosts, HostGuard


def guarded(allowed: AllowedHosts) -> TestClient:
    async def secret(request):
        return PlainTextResponse("every conversation")

    app = Starlette(routes=[Route("/", secret)], middleware=[Middleware(HostGuard, allowed=allowed)])
    return TestClient(app, base_url="http://127.0.0.1:8300")


@pytest.mark.parametrize(
    "host, answered",
    [
        ("127.0.0.1:8300", True),
        ("localhost:8300", True),
        ("[::1]:8300", True),
        ("127.0.0.2", True),
        ("attacker.example:8300", False),
        ("127.0.0.1.attacker.example", False),
        ("", False),
    ],
)
def test_a_loopback_server_answers_only_to_loopback_names(host: str, answered: bool) -> None:
    response = guarded(AllowedHosts.for_bind("127.0.0.1")).get("/", headers={"Host": host})
    assert (response.status_code, "every conversation" in response.text) == ((200, True) if answered else (421, False))


def test_a_server_on_every_address_answers_to_this_machines_names_and_the_extra_ones() -> None:
    allowed = AllowedHosts.for_bind("0.0.0.0", ["sandbox-0", ".modal.host"])
    for host in (socket.gethostname(), "sandbox-0:8080", "abc.r5.modal.host", "localhost"):
        assert allowed.permits(host), host
    for host in ("other-service", "modal.host.attacker.example", "evil.example"):
        assert not allowed.permits(host), host


def test_one_address_means_that_address_and_star_means_any() -> None:
    assert AllowedHosts.for_bind("10.1.2.3").permits("10.1.2.3:9000")
    assert not AllowedHosts.for_bind("10.1.2.3").permits("localhost")
    assert AllowedHosts.for_bind("10.1.2.3", ["*"]).permits("anything.example")


def test_the_demo_policy_refuses_another_host() -> None:
    from temporal_rollouts.policy_servers.demo import build_app

    with TestClient(build_app(), base_url="http://127.0.0.1:8765") as http:
        assert http.get("/v1/models").status_code == 200
        assert http.get("/v1/models", headers={"Host": "attacker.example"}).status_code == 421
