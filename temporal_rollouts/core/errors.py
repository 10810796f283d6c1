"""Every error the project raises on purpose, one class per boundary.

    RolloutError                    root; `retryable` says whether trying again can help,
    │                               `stop_reason` why a rollout stops when it gives up
    ├── ConfigError                 settings, unknown env / policy / sink; never retryable
    │   └── InvalidInput            a workflow or activity input that does not fit its model
    ├── TaskError                   an env or one of its items is wrong
    │   ├── UnknownEnv
    │   ├── BadItem
    │   ├── PayloadTooLarge         env data too big to travel through Temporal
    │   └── ImageBuildFailed        an item's image could not be built (the build log's tail)
    │       ├── UnknownBaseImage    a Dockerfile's FROM names an image the store lacks
    │       └── ImageBuildTimedOut  a build ran past its timeout (retried once)
    ├── SandboxError                the sandbox server or a slot (defined beside the server)
    │   ├── SandboxUnreachable      connection refused / timed out (retryable)
    │   ├── SandboxLaunchFailed     a command could not be started (fork, exec, cgroup; retryable)
    │   ├── SandboxAuthError        wrong or missing token
    │   ├── SlotUnavailable         no slot free within the acquire wait (retryable)
    │   ├── LeaseLost               the slot is no longer leased to the caller
    │   ├── SandboxRequired         isolation is required but bubblewrap is missing
    │   ├── BadToolRequest          a path outside the workspace, a bad op, ...
    │   ├── SnapshotTooLarge        a workspace too big to save for resume
    │   └── TransferTooLarge        an upload or download over its size limit
    ├── ModelError                  the model server; carries `status_code`
    │   ├── ModelUnavailable        5xx, 408, 409, 429 (retryable)
    │   │   ├── ModelUnreachable    connection refused / reset: retried a few times only
    │   │   └── ModelStalled        no answer within the request timeout: retried once
    │   ├── ModelRequestRejected    any other 4xx
    │   └── MalformedModelReply     a 200 whose body is not a chat completion
    └── ContextOverflow             the conversation cannot be fitted into the context budget

The root and the sandbox branch live in `temporal_rollouts.sandbox_server.errors`, as the
sandbox server is a separate program that imports nothing else of the project; they are
re-exported here. Errors that cross into Temporal become `ApplicationError`s through
`as_application_error`, typed by class name; `stop_reason_of` maps such a type name back
to the stop reason its class declares, so workflows keep no table of their own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta

from temporal_rollouts.sandbox_server.errors import (
    BadToolRequest,
    LeaseLost,
    RolloutError,
    SandboxAuthError,
    SandboxError,
    SandboxLaunchFailed,
    SandboxRequired,
    SandboxUnreachable,
    SlotUnavailable,
    SnapshotTooLarge,
    TransferTooLarge,
    error_class,
    raise_from_payload,
)

__all__ = [
    "BadItem",
    "BadToolRequest",
    "ConfigError",
    "ContextOverflow",
    "ImageBuildFailed",
    "ImageBuildTimedOut",
    "LeaseLost",
    "MalformedModelReply",
    "ModelError",
    "ModelRequestRejected",
    "ModelStalled",
    "ModelUnavailable",
    "ModelUnreachable",
    "PayloadTooLarge",
    "RolloutError",
    "InvalidInput",
    "SandboxAuthError",
    "SandboxError",
    "SandboxLaunchFailed",
    "SandboxRequired",
    "SandboxUnreachable",
    "SlotUnavailable",
    "SnapshotTooLarge",
    "TaskError",
    "TransferTooLarge",
    "UnknownBaseImage",
    "UnknownEnv",
    "activity_boundary",
    "as_application_error",
    "raise_from_payload",
    "stop_reason_of",
]

# A server's retry-after is honoured up to this; a day-long hint must not park a rollout.
MAX_RETRY_AFTER_S = 300.0


class ConfigError(RolloutError):
    stop_reason = "config_error"


class InvalidInput(ConfigError):
    """A workflow or activity input that does not fit its model; the message names each bad field."""


class TaskError(RolloutError):
    stop_reason = "env_error"


class UnknownEnv(TaskError):
    stop_reason = "config_error"


class BadItem(TaskError):
    stop_reason = "bad_item"


class PayloadTooLarge(TaskError):
    pass


class ImageBuildFailed(TaskError):
    """The item's image could not be built: a Dockerfile step failed (the message ends with the build
    log's tail). The same files would fail the same way, so it is never retried; the rollout stops
    unscored and can be resumed once the Dockerfile is fixed (a fixed context is a new image)."""

    stop_reason = "image_build_failed"


class UnknownBaseImage(ImageBuildFailed):
    """A Dockerfile's FROM names an image the store does not hold, and no registry is reachable to
    pull it from: the message names the image and says how to provide it, in one line."""


class ImageBuildTimedOut(ImageBuildFailed):
    """A build ran past its timeout: a slow mirror may be to blame, so it is tried once more."""

    retryable = True
    give_up_after_attempts = 2


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
    stop_reason = "model_unavailable"


class ModelUnreachable(ModelUnavailable):
    """Nothing listens, or the connection broke: a server that is down rarely comes back within a
    rollout's patience, so the step gives up after a few quick tries (about 7 s with LLM_TURN's
    1 s, 2 s, 4 s backoff) instead of the minutes a 5xx or 429 gets."""

    give_up_after_attempts = 4


class ModelStalled(ModelUnavailable):
    """The server accepted the request but sent no answer within the policy's `timeout_s`:
    tried twice, so a stalled endpoint fails its rollouts after about 2 x timeout_s."""

    give_up_after_attempts = 2


class ModelRequestRejected(ModelError):
    stop_reason = "model_rejected"


class MalformedModelReply(ModelError):
    stop_reason = "malformed_reply"


class ContextOverflow(RolloutError):
    stop_reason = "context_budget"


def stop_reason_of(type_name: str) -> str | None:
    """The stop reason an error type (an ApplicationError's `type`) declares, if it is one of ours."""
    cls = error_class(type_name)
    return cls.stop_reason if cls is not None else None


def as_application_error(err: RolloutError, attempt: int | None = None):  # -> temporalio.exceptions.ApplicationError
    """`attempt` is the activity's attempt number: an error class with `give_up_after_attempts`
    stops being retryable once that many attempts have failed."""
    from temporalio.exceptions import ApplicationError

    delay = None
    if isinstance(err, ModelError) and err.retry_after_s:
        delay = timedelta(seconds=min(err.retry_after_s, MAX_RETRY_AFTER_S))
    message, retryable = err.message, err.retryable
    limit = getattr(err, "give_up_after_attempts", None)
    if retryable and limit and attempt and attempt >= limit:
        message, retryable = f"{message} (gave up after {attempt} attempts)", False
    return ApplicationError(message, type=type(err).__name__, non_retryable=not retryable, next_retry_delay=delay)


def _activity_attempt() -> int | None:
    from temporalio import activity

    try:
        return activity.info().attempt
    except RuntimeError:  # not inside an activity (unit tests call activity code directly)
        return None


@contextlib.contextmanager
def activity_boundary() -> Iterator[None]:
    """Translate our errors into Temporal application errors inside an activity.

    The chain below our error (httpx and httpcore frames, each with its stack trace) is left
    out: the message already names the cause, and a failure that large is replaced by the
    server with "Failure exceeds size limit." in the pending-activity information that
    `rollouts status` reads."""
    try:
        yield
    except RolloutError as err:
        raise as_application_error(err, _activity_attempt()) from None
