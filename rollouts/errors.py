"""Every error the project raises on purpose, one class per boundary.

    RolloutError                    root; `retryable` says whether trying again can help
    ├── ConfigError                 settings, unknown env / policy / sink; never retryable
    ├── TaskError                   an env or one of its items is wrong
    │   ├── UnknownEnv
    │   ├── BadItem
    │   └── PayloadTooLarge         env data too big to travel through Temporal
    ├── SandboxError                the sandbox server or a slot
    │   ├── SandboxUnreachable      connection refused / timed out (retryable)
    │   ├── SandboxAuthError        wrong or missing token
    │   ├── SlotUnavailable         no slot free within the acquire wait (retryable)
    │   ├── LeaseLost               the slot is no longer leased to the caller
    │   ├── SandboxRequired         isolation is required but bubblewrap is missing
    │   ├── BadToolRequest          a path outside the workspace, a bad op, ...
    │   └── SnapshotTooLarge        a workspace too big to save for resume
    ├── ModelError                  the model server; carries `status_code`
    │   ├── ModelUnavailable        5xx, 408, 409, 429, connection errors (retryable)
    │   ├── ModelRequestRejected    any other 4xx
    │   └── MalformedModelReply     a 200 whose body is not a chat completion
    └── ContextOverflow             the conversation cannot be fitted into the context budget

Errors that cross HTTP travel as `{"error": {"type": ..., "message": ...}}` and are
raised again with their own type by `raise_from_payload`. Errors that cross into
Temporal are turned into `ApplicationError`s by `as_application_error`, whose
`type` is the class name: workflows match on it to record a stop reason.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

# A server's retry-after is honoured up to this; a day-long hint must not park a rollout.
MAX_RETRY_AFTER_S = 300.0


class RolloutError(Exception):
    retryable: bool = False

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable

    def to_payload(self) -> dict[str, Any]:
        return {"error": {"type": type(self).__name__, "message": self.message}}


class ConfigError(RolloutError):
    pass


class TaskError(RolloutError):
    pass


class UnknownEnv(TaskError):
    pass


class BadItem(TaskError):
    pass


class PayloadTooLarge(TaskError):
    pass


class SandboxError(RolloutError):
    pass


class SandboxUnreachable(SandboxError):
    retryable = True


class SandboxAuthError(SandboxError):
    pass


class SlotUnavailable(SandboxError):
    retryable = True


class LeaseLost(SandboxError):
    pass


class SandboxRequired(SandboxError):
    pass


class BadToolRequest(SandboxError):
    pass


class SnapshotTooLarge(SandboxError):
    pass


class ModelError(RolloutError):
    def __init__(
        self,
        message: str,
        *,
        status_code: int | None = None,
        retry_after_s: float | None = None,
        retryable: bool | None = None,
    ) -> None:
        super().__init__(message, retryable=retryable)
        self.status_code = status_code
        self.retry_after_s = retry_after_s


class ModelUnavailable(ModelError):
    retryable = True


class ModelRequestRejected(ModelError):
    pass


class MalformedModelReply(ModelError):
    pass


class ContextOverflow(RolloutError):
    pass


def _all_subclasses(cls: type) -> dict[str, type]:
    found = {cls.__name__: cls}
    for sub in cls.__subclasses__():
        found.update(_all_subclasses(sub))
    return found


def raise_from_payload(payload: Any, *, fallback: type[RolloutError] = SandboxError) -> None:
    """Raise the typed error described by an HTTP error body; do nothing if there is none."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return
    info = payload["error"]
    cls = _all_subclasses(RolloutError).get(str(info.get("type")), fallback)
    raise cls(str(info.get("message", "unknown error")))


def as_application_error(err: RolloutError):  # -> temporalio.exceptions.ApplicationError
    from temporalio.exceptions import ApplicationError

    delay = None
    if isinstance(err, ModelError) and err.retry_after_s:
        delay = timedelta(seconds=min(err.retry_after_s, MAX_RETRY_AFTER_S))
    return ApplicationError(
        err.message,
        type=type(err).__name__,
        non_retryable=not err.retryable,
        next_retry_delay=delay,
    )


@contextlib.contextmanager
def activity_boundary() -> Iterator[None]:
    """Translate our errors into Temporal application errors inside an activity."""
    try:
        yield
    except RolloutError as err:
        raise as_application_error(err) from err
