"""Custom search attributes, so a person can filter rollouts and batches in the Temporal UI.

The embedded dev server registers them at start; on another server, register them once
with `temporal operator search-attribute create` (see `registration_commands`).
"""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

ENV = SearchAttributeKey.for_keyword("RolloutEnv")
BATCH_ID = SearchAttributeKey.for_keyword("RolloutBatchId")
ITEM_ID = SearchAttributeKey.for_keyword("RolloutItemId")
STOP_REASON = SearchAttributeKey.for_keyword("RolloutStopReason")
SCORE = SearchAttributeKey.for_float("RolloutScore")
COMPLETED = SearchAttributeKey.for_int("RolloutsCompleted")
RESUMED_FROM = SearchAttributeKey.for_keyword("RolloutResumedFrom")
POLICY = SearchAttributeKey.for_keyword("RolloutPolicy")
"""The policy a batch runs on, as the CLI resolved it when it started the batch."""
FORKED_FROM = SearchAttributeKey.for_keyword("RolloutForkedFrom")
"""The rollout a fork or branch began from: `RolloutForkedFrom = 'ID'` lists a rollout's branches."""
FORK_TURN = SearchAttributeKey.for_int("RolloutForkTurn")
"""The turn of its parent after which a fork or branch began."""

ALL: tuple[SearchAttributeKey, ...] = (
    ENV,
    BATCH_ID,
    ITEM_ID,
    STOP_REASON,
    SCORE,
    COMPLETED,
    RESUMED_FROM,
    POLICY,
    FORKED_FROM,
    FORK_TURN,
)

_CLI_TYPES = {"KEYWORD": "Keyword", "DOUBLE": "Double", "INT": "Int"}


def dev_server_flags() -> list[str]:
    """`--search-attribute NAME=Type` flags for `temporal server start-dev`."""
    flags: list[str] = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={_CLI_TYPES[key.indexed_value_type.name]}"]
    return flags


def registration_commands(namespace: str = "default") -> list[str]:
    return [
        f"temporal operator search-attribute create --namespace {namespace} "
        f"--name {key.name} --type {_CLI_TYPES[key.indexed_value_type.name]}"
        for key in ALL
    ]
