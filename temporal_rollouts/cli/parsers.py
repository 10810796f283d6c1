"""The flags of `rollouts show`, `export`, `list`, `cancel`, `train`, `fork`, `envs`, `versions` and `images`.

Apart from the commands, and importing nothing but argparse: `rollouts --help` builds every
parser, and a command's modules (pydantic, the Temporal client, rich) cost more than a second
of CPU to import, so they are imported only by the command that runs (bench/cli_help.py
measures it).
"""

from __future__ import annotations

import argparse
from typing import Any

from temporal_rollouts.cli.help_format import DefaultsHelpFormatter
from temporal_rollouts.core import defaults  # plain values, importing nothing
from temporal_rollouts.core.defaults import BATCHES_LISTED, ROLLOUTS_LISTED

STALE_GROUPS = ("post", "scores_only", "drop", "requeue")
"""`core.feed.StaleGroups`, spelt out so that this module imports no model (a unit test compares them)."""
WORKSPACE_REBUILDS = ("auto", "snapshot", "replay")
"""`core.forks.WorkspaceRebuild`, spelt out for the same reason (the same test compares them)."""


def json_flag(flag: str, text: str) -> Any:
    """The value of a flag that takes JSON (`--env-config`), or an error naming the flag."""
    import json

    from temporal_rollouts.core.errors import InvalidInput

    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InvalidInput(f"{flag}: not valid JSON ({err})") from None


def add_env_flags(parser: argparse.ArgumentParser) -> None:
    """`--env` or `--tasks` (a folder of Harbor tasks: env `harbor`), `--env-config` and `--env-module`."""
    parser.add_argument("--env", default=None, help="an env the workers know (`rollouts envs` lists them)")
    parser.add_argument(
        "--tasks",
        default=None,
        metavar="PATH",
        help="a folder of Harbor task folders, or one task folder (the env `harbor`; docs/harbor.md): "
        "checked here, then read by the workers at the same path",
    )
    parser.add_argument("--env-config", default=None, help="JSON object passed to the env")
    add_env_module_flag(parser)


def env_and_config(args: argparse.Namespace) -> tuple[str, dict[str, Any], int | None]:
    """The env and its config the flags name, and with `--tasks` how many tasks the folder holds. `--tasks` is
    checked here, every task of it, so a broken `task.toml` is refused before anything starts; what the tasks
    ask for that is not honoured is printed."""
    import sys
    from pathlib import Path

    from temporal_rollouts.core.errors import InvalidInput

    config = json_flag("--env-config", args.env_config) if args.env_config else {}
    if not isinstance(config, dict):
        raise InvalidInput("--env-config: must be a JSON object")
    if args.tasks is None:
        if not args.env:
            raise InvalidInput("name the env: --env ENV, or --tasks PATH for a folder of Harbor tasks")
        return args.env, config, None
    if args.env not in (None, "harbor"):
        raise InvalidInput(f"--tasks runs the env harbor, not {args.env!r}: drop --env")
    from envs.harbor import HarborEnv

    config = {**config, "path": str(Path(args.tasks).resolve())}
    env = HarborEnv(config)
    tasks = env.check_all()
    for task in tasks:
        for note in env.task_notes(task):
            print(f"harbor task {task.name}: {note}", file=sys.stderr)
    return "harbor", config, len(tasks)


def add_env_module_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--env-module",
        action="append",
        dest="env_modules",
        metavar="MODULE",
        help="also load the envs of this module (a name on the import path, or a .py file); repeatable, "
        "adds to settings env_modules",
    )


def add_filter_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--status", default=None, help="with a BATCH_ID: running, completed, failed, canceled, terminated or timed_out"
    )
    parser.add_argument(
        "--stop-reason", default=None, help="with a BATCH_ID: e.g. completed, max_turns, model_rejected"
    )
    parser.add_argument(
        "--min-score", type=float, default=None, help="with a BATCH_ID: scored rollouts from this score"
    )
    parser.add_argument(
        "--max-score", type=float, default=None, help="with a BATCH_ID: scored rollouts up to this score"
    )


def add_inspect_parsers(sub: Any) -> None:
    show = sub.add_parser("show", help="a rollout's conversation, tool calls, results, stop reason, score and timings")
    show.add_argument(
        "rollout_id", help="e.g. batch-terminal_tasks-1a2b3c4d/item-0/g1 (`rollouts list BATCH_ID` lists them)"
    )
    show.add_argument("--json", action="store_true", help="the whole record as one JSON object")

    export = sub.add_parser("export", help="every rollout of a batch, failed ones included, as JSONL")
    export.add_argument("batch_id")
    export.add_argument(
        "--output", default=None, help="JSONL path (default: <data_dir>/exports/<batch id>.rollouts.jsonl)"
    )
    export.add_argument(
        "--html", action="store_true", help="also write the Atropos viewer's HTML beside it (needs the rl extra)"
    )
    export.add_argument("--json", action="store_true", help="print a JSON summary")

    listing = sub.add_parser(
        "list",
        help="batches, newest first, with their counts; or the rollouts of one batch",
        description="Without an id: batches, newest first, with their counts. With the id of a batch, a "
        "training run or a fork: its rollouts (ids for `rollouts show`), filtered.",
    )
    listing.add_argument(
        "batch_id",
        nargs="?",
        default=None,
        metavar="ID",
        help="list the rollouts of this batch, training run or fork (`rollouts fork` prints its id) instead",
    )
    listing.add_argument(
        "--limit",
        type=int,
        default=None,
        help=f"how many batches (default {BATCHES_LISTED}) or rollouts (default {ROLLOUTS_LISTED})",
    )
    add_filter_arguments(listing)
    listing.add_argument("--json", action="store_true")

    view = sub.add_parser(
        "view",
        help="a local web page of batches, rollouts and trajectories",
        add_help=False,
        prefix_chars="\0",  # every flag is the page's own: `rollouts view --help` is its help (view/serve.py)
    )
    view.add_argument("rest", nargs=argparse.REMAINDER)

    cancel = sub.add_parser("cancel", help="cancel a running batch; its rollouts release their slots")
    cancel.add_argument("batch_id")
    cancel.add_argument("--json", action="store_true")


def add_train_parser(sub: Any) -> None:
    train = sub.add_parser("train", help="training runs a trainer takes batches from: start, serve, status, stop, list")
    actions = train.add_subparsers(dest="train_command", required=True)
    start = actions.add_parser("start", help="start a training run", formatter_class=DefaultsHelpFormatter)
    start.add_argument("name", help="the run's name (its workflow id)")
    add_env_flags(start)
    start.add_argument("--policy", default=None, help="a token-level policy, or a chat policy with a tokenizer")
    start.add_argument(
        "--tokenizer",
        default=None,
        help="for a chat policy that names none: a tokenizer (name or folder on the workers) for template tokens",
    )
    start.add_argument("--group-size", type=int, default=defaults.FEED_GROUP_SIZE)
    start.add_argument(
        "--batch-size",
        type=int,
        default=defaults.FEED_BATCH_SIZE,
        help="sequences per trainer batch at the door (whole groups); 0: the first trainer to register says",
    )
    start.add_argument(
        "--max-staleness", type=int, default=defaults.FEED_MAX_STALENESS, help="trainer steps a posted token may lag"
    )
    start.add_argument(
        "--stale-groups",
        choices=STALE_GROUPS,
        default=defaults.FEED_STALE_GROUPS,
        help="what happens to a group staler than the bound when it would reach the trainer (requeue: the door only)",
    )
    start.add_argument(
        "--in-flight", type=int, default=defaults.FEED_GROUPS_IN_FLIGHT, help="groups whose rollouts run at once"
    )
    start.add_argument(
        "--max-groups",
        type=int,
        default=defaults.FEED_MAX_GROUPS,
        help="stop after posting this many groups; 0: until stopped",
    )
    start.add_argument(
        "--max-retries",
        type=int,
        default=defaults.FEED_MAX_RETRIES,
        help="runs a rollout gets after a machinery failure",
    )
    start.add_argument("--max-turns", type=int, default=None)
    start.add_argument("--temperature", type=float, default=None)
    start.add_argument("--max-tokens", type=int, default=None, help="per-turn generation cap")
    start.add_argument("--api-url", default=None, help="run-api; default: the config's atropos.api_url")
    start.add_argument(
        "--sink",
        choices=["door", "atropos", "jsonl"],
        default=defaults.FEED_SINK,
        help="door: trainers take batches (rollouts train serve); atropos: post to run-api; jsonl: a file",
    )
    start.add_argument("--output", default=None, help="JSONL file in the results folder (--sink jsonl)")
    start.add_argument("--json", action="store_true")
    serve = actions.add_parser(
        "serve",
        help="the trainer door: trainers take and acknowledge runs' batches over HTTP",
        add_help=False,
        prefix_chars="\0",  # every flag is the endpoint's own: `rollouts train serve --help` is its help (door/server.py)
    )
    serve.add_argument("rest", nargs=argparse.REMAINDER)
    status = actions.add_parser("status", help="a run's figures: in flight, posted, stale, retried, dropped")
    status.add_argument("name")
    status.add_argument("--json", action="store_true")
    status.add_argument(
        "--watch", action="store_true", help="redraw until the run ends (Ctrl-C leaves the run running)"
    )
    stop = actions.add_parser("stop", help="stop a run: no new groups; the ones in flight finish and are posted")
    stop.add_argument("name")
    stop.add_argument("--now", action="store_true", help="cancel the rollouts in flight instead")
    actions.add_parser("list", help="training runs, newest first")


def add_fork_parser(sub: Any) -> None:
    fork = sub.add_parser(
        "fork",
        help="N continuations of a rollout from its turn K",
        description="The continuations begin with the rollout's first K turns by reference (the same messages, "
        "token ids and logprobs: nothing is generated again) and its workspace as it was after turn K, then run "
        "as ordinary rollouts and are scored. Before anything starts, this says what is reused, how the workspace "
        "will be rebuilt and what cannot be carried; then it prints the id of every continuation.",
    )
    fork.add_argument("rollout_id")
    fork.add_argument("--at-turn", type=int, required=True, help="keep the first K model turns (0: only the prompt)")
    fork.add_argument("-n", type=int, default=1, help="continuations (default: %(default)s)")
    fork.add_argument("--policy", default=None, help="continue with another policy (default: the rollout's own)")
    fork.add_argument("--temperature", type=float, default=None, help="continue at another temperature")
    fork.add_argument(
        "--rebuild",
        choices=WORKSPACE_REBUILDS,
        default=defaults.FORK_REBUILD,
        help="how the workspace is rebuilt: auto takes a snapshot of turn K when one exists",
    )
    fork.add_argument(
        "--allow-divergence",
        action="store_true",
        help="go on when a replayed tool call answers differently than it did",
    )
    fork.add_argument("--id", default=None, help="the fork's workflow id (default: ROLLOUT_ID/fork-<random>)")
    fork.add_argument("--wait", action="store_true", help="wait for the continuations and show how they ended")
    fork.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def add_envs_parser(sub: Any) -> None:
    envs = sub.add_parser(
        "envs",
        help="every env, with where it comes from (bundled, a package's entry point, a module)",
        description="Every env this machine's settings load: bundled, installed packages' entry points "
        "(group temporal_rollouts.envs) and env_modules. Exits 1 when a source failed to load.",
    )
    add_env_module_flag(envs)
    envs.add_argument("--json", action="store_true", help="one JSON object: envs and the sources that failed")


def add_versions_parser(sub: Any) -> None:
    versions = sub.add_parser("versions", help="worker builds: which takes new work, which are drained")
    versions.add_argument("--set-current", metavar="BUILD", default=None, help="make BUILD take new batches")
    versions.add_argument("--json", action="store_true")


def add_images_parser(sub: Any) -> None:
    images = sub.add_parser("images", help="item images: list, load, build, bootstrap the base image")
    action = images.add_subparsers(dest="images_command", required=True)
    listing = action.add_parser("list", help="the images in this worker's store")
    listing.add_argument("--json", action="store_true")
    load = action.add_parser("load", help="load a `podman save` archive (e.g. a base image) into the store")
    load.add_argument("archive", help="the archive file")
    build = action.add_parser("build", help="build a context (a folder with a Dockerfile) as a rollout would")
    build.add_argument("context", help="the build context folder")
    build.add_argument("--dockerfile", default="Dockerfile")
    build.add_argument("--name", default=None, help="a readable name for the tag; the folder's name by default")
    build.add_argument(
        "--push",
        metavar="REGISTRY",
        default=None,
        help="also add the sandbox server's layer and push it there (for Nomad: name items by the printed reference)",
    )
    build.add_argument("--json", action="store_true")
    action.add_parser("bootstrap", help="make debian:bookworm-slim ready in the store (from the Debian mirror)")
