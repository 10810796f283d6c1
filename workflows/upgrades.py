"""When a long-lived workflow moves to a new worker build (docs/upgrades.md).

Every workflow is pinned to the build it started on (the worker's default versioning
behaviour). The training feed and the pool's maintenance workflow run for days, so they
continue as new at their next quiet point once a newer build is current, and the new run
starts on it: neither ever replays its history on code other than its own.
"""

from __future__ import annotations

from temporalio import workflow


def time_to_continue() -> bool:
    """The history is long, or a newer build is current: continue as new at the next quiet point."""
    info = workflow.info()
    return info.is_continue_as_new_suggested() or info.is_target_worker_deployment_version_changed()


def continue_on_current_build() -> workflow.ContinueAsNewVersioningBehavior | None:
    """`continue_as_new`'s `initial_versioning_behavior`: start the next run on the current build
    (then pinned to it), where the worker is versioned; None where it is not."""
    if workflow.info().get_current_deployment_version() is None:
        return None
    return workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
