"""The control layer: what starts, queries and lists runs, for every caller above it.

The CLI, the web page (`view/`), the Atropos integration, the examples and the benchmarks
all come through here, and never through each other:

- `connection`: the client every command uses (and the store check), and one that only reads;
- `batches`: the input a batch starts with, starting it, its status, cancelling it;
- `training`: start, read, list and stop training runs;
- `forks`: where a rollout is forked and the fork's tree started;
- `resume`: continue a failed rollout, or a batch's failed rollouts;
- `records`: one record per rollout, one summary per batch, what waits on retries;
- `rollout_rows`: a batch's (training run's, fork's) rollouts as filtered rows;
- `exports`: every rollout of a batch as JSONL;
- `envs`: the envs this process knows, as a command finds them;
- `slots`: a pass of the slot reaper now.

Nothing here parses flags or prints (tests/unit/test_layers.py): a caller gets values and
errors (ConfigError with a sentence) and words them its own way. Importing this package
imports nothing.
"""
