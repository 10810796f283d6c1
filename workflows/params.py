"""Every activity's timeouts and retry policy, in one place.

Heartbeat timeouts are what bring a step back after a worker dies: a step on a dead
worker is retried on another within its heartbeat timeout (10 s), or its start-to-close
timeout for steps too short to heartbeat (at most 15 s for steps a rollout waits on).
Tool calls are local activities: a dead worker shows as a workflow task timeout (10 s).
Which errors are worth retrying is decided where they are raised (rollouts/errors.py
marks each ApplicationError), not listed here: the list would be repeated in every
scheduled step's history event. Errors our code marks non-retryable (a
400 from the model, a bad item, an unknown env) are never retried.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy


def _retry(max_attempts: int, *, initial_s: float = 1.0, max_interval_s: float = 30.0) -> RetryPolicy:
    """`max_attempts` 0 retries until it works (a training run waits out a run-api that is down)."""
    return RetryPolicy(
        initial_interval=timedelta(seconds=initial_s),
        backoff_coefficient=2.0,
        maximum_interval=timedelta(seconds=max_interval_s),
        maximum_attempts=max_attempts,
    )


@dataclass(frozen=True)
class StepParams:
    start_to_close_s: float
    heartbeat_s: float | None
    retry: RetryPolicy

    def options(self) -> dict[str, Any]:
        opts: dict[str, Any] = {
            "start_to_close_timeout": timedelta(seconds=self.start_to_close_s),
            "retry_policy": self.retry,
        }
        if self.heartbeat_s is not None:
            opts["heartbeat_timeout"] = timedelta(seconds=self.heartbeat_s)
        return opts


LOAD_ITEMS = StepParams(start_to_close_s=30, heartbeat_s=None, retry=_retry(5))
# Building an item's image: the builder enforces the image's own build timeout; this step's timeout
# only bounds it from outside (waiting for another rollout's build of it, then its own).
DEFAULT_BUILD_TIMEOUT_S = 3600.0


def build_image(build_timeout_s: float | None) -> StepParams:
    timeout_s = build_timeout_s or DEFAULT_BUILD_TIMEOUT_S
    return StepParams(start_to_close_s=2 * timeout_s + 600, heartbeat_s=30, retry=_retry(4, max_interval_s=60))


# Acquire waits for a free slot itself (up to the sandbox acquire timeout) and heartbeats meanwhile.
ACQUIRE_SLOT = StepParams(start_to_close_s=3600, heartbeat_s=10, retry=_retry(10))
SETUP_WORKSPACE = StepParams(start_to_close_s=900, heartbeat_s=10, retry=_retry(5))
# A model call may take minutes; the heartbeat finds a dead worker in seconds.
LLM_TURN = StepParams(start_to_close_s=600, heartbeat_s=10, retry=_retry(8, max_interval_s=60))
# The longest command timeout a tool call may ask for; a tool call's step gets 60 s on top of it.
MAX_COMMAND_TIMEOUT_S = 600.0
# A tool call is a local activity: it runs on the worker that runs the workflow task, with no
# activity task round trip through the server, and its result is recorded with the next
# workflow task. It cannot heartbeat; instead the SDK keeps the workflow task alive while it
# runs, so a dead worker shows as a workflow task timeout (10 s) and the next worker runs the
# call again under the same call id, which the sandbox answers from its result store (or by
# waiting on the same command if it is still running). Retry backoffs stay under the local
# retry threshold (1 min), so every retry runs on the same worker.
TOOL_CALL_LOCAL = StepParams(start_to_close_s=60 + MAX_COMMAND_TIMEOUT_S, heartbeat_s=None, retry=_retry(6))
# A harness in the slot: its start (which may first build its bundle), each wait for its next model request
# (the step heartbeats; the loop waits again until the wall-clock budget is spent), each answer, and a stop.
START_HARNESS = StepParams(start_to_close_s=1800, heartbeat_s=10, retry=_retry(5))
HARNESS_WAIT_S = 300.0
NEXT_HARNESS_CALL = StepParams(start_to_close_s=HARNESS_WAIT_S + 60, heartbeat_s=10, retry=_retry(10))
ANSWER_HARNESS_CALL = StepParams(start_to_close_s=30, heartbeat_s=None, retry=_retry(10, max_interval_s=10))
STOP_HARNESS = StepParams(start_to_close_s=60, heartbeat_s=None, retry=_retry(5))
VERIFY = StepParams(start_to_close_s=1200, heartbeat_s=10, retry=_retry(5))


def verify(verify_s: float | None) -> StepParams:
    """The verify step, outlasting an item's own verifier timeout (`ItemTimeouts.verify_s`) with room to spare."""
    if verify_s is None or verify_s + 600 <= VERIFY.start_to_close_s:
        return VERIFY
    return StepParams(start_to_close_s=verify_s + 600, heartbeat_s=VERIFY.heartbeat_s, retry=VERIFY.retry)


RELEASE_SLOT = StepParams(start_to_close_s=10, heartbeat_s=None, retry=_retry(20, max_interval_s=10))
WRITE_GROUP = StepParams(start_to_close_s=15, heartbeat_s=None, retry=_retry(10))
# A batch gathering again waits on a rollout that something else resumed.
AWAIT_ROLLOUT = StepParams(start_to_close_s=24 * 3600, heartbeat_s=10, retry=_retry(10))
SNAPSHOT = StepParams(start_to_close_s=600, heartbeat_s=10, retry=_retry(3))
# Forks: find the state after turn K (reads of storage), copy a parent's live workspace (in place or
# through the worker), replay recorded tool calls (each answered from the journal when retried).
LOAD_FORK_POINT = StepParams(start_to_close_s=120, heartbeat_s=None, retry=_retry(5))
COPY_WORKSPACE = StepParams(start_to_close_s=900, heartbeat_s=10, retry=_retry(5))
REPLAY_TOOL_CALLS = StepParams(start_to_close_s=3600, heartbeat_s=10, retry=_retry(5))
# Slot-pool maintenance: health checks, reaping and scale-down each take seconds.
POOL_MAINTENANCE = StepParams(start_to_close_s=120, heartbeat_s=None, retry=_retry(3))
# A training feed: its check before it starts, then run-api steps that must outlast a run-api restart.
FEED_CHECK = StepParams(start_to_close_s=60, heartbeat_s=None, retry=_retry(5))
TRAINER_VIEW = StepParams(start_to_close_s=90, heartbeat_s=15, retry=_retry(0, max_interval_s=15))
POST_FEED_GROUP = StepParams(start_to_close_s=120, heartbeat_s=None, retry=_retry(0, max_interval_s=15))
CHECK_FEED_ROLLOUTS = StepParams(start_to_close_s=300, heartbeat_s=30, retry=_retry(5))
