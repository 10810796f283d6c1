"""The defaults of what a person types: a batch, a training run, a listing. Plain values, importing nothing.

Each is written once, here. The input models (`records.BatchInput`, `records.RolloutLimits`,
`feed.FeedInput`) take their fields' defaults from these names, and so do the `rollouts` flags
(cli/parsers.py), which must build every parser without importing pydantic so that `--help`
answers at once (bench/cli_help.py). Whoever else needs one of these defaults (the Atropos env's
config, an activity's input) reads it from the model (`inputs.field_default`).
"""

from __future__ import annotations

BATCH_ITEMS = 4
"""`BatchInput.num_items`: items of the env's task set."""
BATCH_GROUP_SIZE = 2
"""`BatchInput.group_size`: rollouts per item."""
BATCH_ITEM_OFFSET = 0
"""`BatchInput.item_offset`: the first item."""
BATCH_MAX_CONCURRENCY = 32
"""`BatchInput.max_concurrency`: rollouts running at once."""
BATCH_START_RATE = 0
"""`BatchInput.start_rate`: rollouts started per second at most; 0 starts them as fast as the batch can."""
MAX_TURNS = 30
"""`RolloutLimits.max_turns`: model turns before a rollout stops."""

FEED_GROUP_SIZE = 8
"""`FeedInput.group_size`: rollouts per group of a training run."""
FEED_GROUPS_IN_FLIGHT = 16
"""`FeedInput.max_groups_in_flight`: groups whose rollouts run at once."""
FEED_MAX_STALENESS = 1
"""`FeedInput.max_staleness`: trainer steps a posted token may lag."""
FEED_STALE_GROUPS = "post"
"""`FeedInput.stale_groups`: what becomes of a group that ends staler anyway (`feed.StaleGroups`)."""
FEED_MAX_RETRIES = 3
"""`FeedInput.max_retries`: runs a rollout gets after a machinery failure."""
FEED_MAX_GROUPS = 0
"""`FeedInput.max_groups`: groups posted before the run stops; 0 runs until stopped."""
FEED_SINK = "door"
"""`FeedInput.sink`: where a training run's groups go (the trainer door; `atropos`: run-api; `jsonl`)."""
FEED_BATCH_SIZE = 0
"""`FeedInput.batch_size`: sequences per trainer batch at the door; 0: the first trainer to register says."""

FORK_REBUILD = "auto"
"""`forks.ForkSpec.rebuild`: how a fork rebuilds the workspace (auto: from a snapshot of that turn where one exists)."""

BATCHES_LISTED = 20
"""Batches `rollouts list` shows unless --limit says otherwise."""
ROLLOUTS_LISTED = 10_000
"""Rows listed for one batch at most; a filter narrows a larger batch."""
