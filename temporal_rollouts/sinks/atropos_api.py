"""A small client for Atropos' trajectory API (`run-api`): the env side posts scored
groups, the trainer side registers and pulls batches. httpx only, so the sink activity
needs no atroposlib."""

from __future__ import annotations

from typing import Any

import httpx

from temporal_rollouts.core.errors import ConfigError, RolloutError


class TrajectoryApiError(RolloutError):
    """run-api could not be reached or refused a request; retrying may help."""

    retryable = True


class TrajectoryApi:
    def __init__(
        self, base_url: str, timeout_s: float = 60.0, *, transport: httpx.AsyncBaseTransport | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(base_url=self.base_url, timeout=timeout_s, transport=transport)

    async def __aenter__(self) -> TrajectoryApi:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = await self._http.request(method, path, json=body)
        except httpx.HTTPError as exc:
            raise TrajectoryApiError(f"Atropos trajectory API at {self.base_url} unreachable: {exc!r}") from exc
        if response.status_code == 422:
            raise ConfigError(f"Atropos trajectory API rejected {path}: {response.text[:300]}")
        if response.status_code >= 400:
            raise TrajectoryApiError(
                f"Atropos trajectory API {path}: HTTP {response.status_code}: {response.text[:300]}"
            )
        return response.json()

    # env side
    async def post_group(self, group: dict[str, Any]) -> dict[str, Any]:
        return await self._call("POST", "/scored_data", group)

    async def register_env(
        self, name: str, max_token_length: int, group_size: int, weight: float = 1.0
    ) -> dict[str, Any]:
        """`{"status": "success", "env_id": ...}`, or `{"status": "wait for trainer to start"}` until the
        trainer has asked for its first batch."""
        return await self._call(
            "POST",
            "/register-env",
            {"desired_name": name, "max_token_length": max_token_length, "group_size": group_size, "weight": weight},
        )

    async def env_status(self, env_id: int) -> dict[str, Any] | None:
        """This env's view of the queue (`self_queue_size` groups of its own waiting); None when run-api does
        not know `env_id` (it restarted and lost its registrations)."""
        try:
            # run-api fails an unknown env id with an exception, after which uvicorn drops the connection
            # without telling: the next request on it (the registration that follows) would read nothing.
            response = await self._http.request(
                "GET", "/status-env", json={"env_id": env_id}, headers={"Connection": "close"}
            )
        except httpx.HTTPError as exc:
            raise TrajectoryApiError(f"Atropos trajectory API at {self.base_url} unreachable: {exc!r}") from exc
        if response.status_code >= 500 or response.status_code == 422:
            return None  # run-api answers an unknown env id with an IndexError, a 500
        if response.status_code >= 400:
            raise TrajectoryApiError(f"Atropos trajectory API /status-env: HTTP {response.status_code}")
        return response.json()

    async def latest_group(self) -> dict[str, Any]:
        """The group run-api received last (to tell whether a post whose answer was lost arrived)."""
        return await self._call("GET", "/latest_example")

    async def trainer_info(self) -> dict[str, Any]:
        """The registered trainer's `batch_size` and `max_token_len` (-1 before a trainer registers)."""
        return await self._call("GET", "/info")

    async def status(self) -> dict[str, Any]:
        """The trainer's `current_step` and the `queue_size` of groups waiting."""
        return await self._call("GET", "/status")

    # trainer side
    async def register_trainer(self, **registration: Any) -> dict[str, Any]:
        return await self._call("POST", "/register", registration)

    async def batch(self) -> list[dict[str, Any]] | None:
        """The next training batch, or None while fewer than a batch's sequences are queued."""
        return (await self._call("GET", "/batch")).get("batch")
