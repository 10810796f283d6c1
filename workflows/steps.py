"""How a failed step becomes the reason a rollout stops, shared by the trajectory and its fork steps."""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError

with workflow.unsafe.imports_passed_through():
    from temporal_rollouts.core.errors import stop_reason_of
    from temporal_rollouts.core.records import StopReason


class StepFailed(Exception):
    """A step failed for good; carries why the rollout stops."""

    def __init__(self, reason: StopReason, detail: str) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail


def stop_for(err: ActivityError, phase_default: StopReason) -> StepFailed:
    """Why the rollout stops: the stop reason the error's class declares (core.errors), else the step's default."""
    cause = err.cause
    if isinstance(cause, ApplicationError):
        name = cause.type or ""
        declared = stop_reason_of(name)
        return StepFailed(StopReason(declared) if declared else phase_default, f"{name}: {cause.message}")
    if isinstance(cause, TimeoutError):
        return StepFailed(phase_default, f"{err.activity_type} timed out ({cause.type.name if cause.type else ''})")
    return StepFailed(phase_default, f"{err.activity_type} failed: {cause or err}")
