"""The demo policy as a real HTTP server process, steered through its /control endpoint."""

from __future__ import annotations

import sys

import httpx

from tests.support.servers.process import HOST, LoopbackServer


class DemoPolicyProcess(LoopbackServer):
    """The demo policy in its own process, steered through its /control endpoint."""

    what = "demo policy"
    stop_wait_s = 5.0  # a request parked in an injected delay is killed after this

    def start(self) -> None:
        self.launch(
            [
                sys.executable,
                "-m",
                "temporal_rollouts.policy_servers.demo",
                "--host",
                HOST,
                "--port",
                str(self.port),
                "--enable-control",
            ]
        )
        self.wait_ready()

    def control(self, **faults) -> dict:
        return httpx.post(f"{self.url}/control", json=faults, timeout=10).raise_for_status().json()

    def reset(self) -> None:
        self.control(reset=True)
        httpx.post(f"{self.url}/stats/reset", timeout=10).raise_for_status()

    def stats(self) -> dict:
        return httpx.get(f"{self.url}/stats", timeout=10).raise_for_status().json()
