"""The root of the project's error tree, and the errors a sandbox server raises.

They live here because the sandbox server is a separate program that imports
nothing else of the project, yet its errors must be the same classes the worker
catches. `temporal_rollouts.core.errors` builds the rest of the tree on this root.

Every error carries what the rest of the system needs to act on it: whether trying
again can help (`retryable`) and why a rollout stops when it gives up
(`stop_reason`, a StopReason value; None leaves the choice to the step that failed).
Errors that cross HTTP travel as `{"error": {"type": ..., "message": ...}}` and are
raised again with their own type by `raise_from_payload`.
"""

from __future__ import annotations

from typing import Any


class RolloutError(Exception):
    retryable: bool = False
    stop_reason: str | None = None

    def __init__(self, message: str, *, retryable: bool | None = None) -> None:
        super().__init__(message)
        self.message = message
        if retryable is not None:
            self.retryable = retryable

    def to_payload(self) -> dict[str, Any]:
        return {"error": {"type": type(self).__name__, "message": self.message}}


class SandboxError(RolloutError):
    stop_reason = "sandbox_error"


class SandboxUnreachable(SandboxError):
    retryable = True


class SandboxLaunchFailed(SandboxError):
    """The sandbox could not start a command (cannot fork, cannot exec, cannot join the slot's cgroup):
    the machinery failed, not the model, so it is never a tool result nor a verdict."""

    retryable = True


class SandboxAuthError(SandboxError):
    pass


class SlotUnavailable(SandboxError):
    retryable = True
    stop_reason = "slot_unavailable"


class LeaseLost(SandboxError):
    pass


class HarnessGone(SandboxError):
    """The slot runs no harness of that id: the sandbox server restarted (taking it along), or it was stopped."""


class SandboxRequired(SandboxError):
    pass


class BadToolRequest(SandboxError):
    pass


class SnapshotTooLarge(SandboxError):
    pass


class TransferTooLarge(SandboxError):
    pass


def error_class(name: str) -> type[RolloutError] | None:
    """The error class of that name anywhere in the tree (subclasses defined elsewhere included)."""
    pending: list[type[RolloutError]] = [RolloutError]
    while pending:
        cls = pending.pop()
        if cls.__name__ == name:
            return cls
        pending.extend(cls.__subclasses__())
    return None


def raise_from_payload(payload: Any, *, fallback: type[RolloutError] = SandboxError) -> None:
    """Raise the typed error described by an HTTP error body; do nothing if there is none."""
    if not isinstance(payload, dict) or not isinstance(payload.get("error"), dict):
        return
    info = payload["error"]
    cls = error_class(str(info.get("type"))) or fallback
    raise cls(str(info.get("message", "unknown error")))
