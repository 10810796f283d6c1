"""A GRPO trainer small enough to read in one sitting: CPU torch, the model the CPU policy
server serves, scored groups in from the trainer door (or Atropos' run-api), new weights out as
the server's next version.

    python -m examples.grpo.trainer --door http://127.0.0.1:8780 --run word-run \\
        --policy-server http://127.0.0.1:30000 --batch-size 16 --steps 30 --checkpoints runs/grpo/checkpoints
    python -m examples.grpo.trainer --run-api http://127.0.0.1:8000 ...      # the same, from run-api

From the door, each batch is acknowledged once its weights are served: the run counts the
trainer's version by its acknowledgements, and a batch this trainer took but did not finish (it
was killed) is handed out again. A group the door marks stale (staler than the run's bound) is
left out of the step and counted, never trained silently.

One step (`train_step`) on a batch of groups (each: `tokens`, `masks`, `scores`,
`inference_logprobs`, as run-api's `/batch` and the JSONL sink give them):

- advantage of a sequence = (score - its group's mean) / (its group's std + eps); a
  group whose scores are all equal teaches nothing and is skipped;
- on the trainable tokens (mask != -100) the PPO-style clipped objective
  min(ratio * A, clip(ratio, 1 - clip, 1 + clip) * A), with ratio =
  exp(logp_trainer - logp_inference): the logprobs the server reported are the
  behaviour policy, so tokens sampled by older weights are weighted, and clipped, for
  how far the policy has moved since;
- the loss is its negative mean over every trainable token of the batch; one AdamW step.

`save_and_publish` writes the weights to a new folder and asks the server to load them
as version `step` (SGLang's `/update_weights_from_disk`); the server must see the same
disk. The model stays in eval mode throughout (no dropout) and in float32, as the server
runs it, so trainer and server compute the same logprobs for the same weights: each
step reports how far apart they were (`logprob_gap_*`), which should be ~1e-5.

No reference model and no KL term: a short run from a good start does not need them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import shutil
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import torch

from temporal_rollouts.policy_servers import smollm2
from temporal_rollouts.policy_servers.weights import load_into, read_state_dict, save_weights

IGNORE_INDEX = -100


@dataclass
class ScoredSequence:
    tokens: list[int]
    trainable: list[int]
    """Positions of the tokens the model generated (mask != -100)."""
    inference_logprobs: list[float]
    """The server's logprob of each trainable token, in the order of `trainable`."""
    advantage: float
    versions: list[int | None] = field(default_factory=list)
    """The policy version of each model turn (the feed's `overrides[i].policy_versions`), where known."""


@dataclass
class StepStats:
    mean_reward: float
    loss: float
    sequences: int
    """Sequences trained on (groups with equal scores are left out)."""
    tokens: int
    logprob_gap_mean: float
    """Mean |trainer logprob - inference logprob| over the trained tokens, before the update."""
    logprob_gap_max: float
    clipped: float
    """Share of trained tokens whose ratio fell outside the clip range."""
    seconds: float
    current_gap_mean: float = math.nan
    """The same gap over the tokens sampled by the weights being trained (`current_version`) only:
    older tokens differ by how far the policy moved, these only by float noise."""
    current_gap_max: float = math.nan
    current_tokens: int = 0
    stale_skipped: int = 0
    """Groups the door marked staler than the run's bound, left out of the step."""

    def line(self) -> str:
        return (
            f"reward {self.mean_reward:.3f}  loss {self.loss:+.4f}  seqs {self.sequences:3d}  "
            f"tokens {self.tokens:5d}  "
            f"|dlogp| mean {self.logprob_gap_mean:.1e} max {self.logprob_gap_max:.1e}  clipped {self.clipped:.2f}  "
            f"{self.seconds:.0f}s"
        )


def group_advantages(scores: list[float], eps: float = 1e-6) -> list[float]:
    mean, std = statistics.fmean(scores), statistics.pstdev(scores)
    return [(score - mean) / (std + eps) for score in scores]


def sequences_of(groups: list[dict[str, Any]], eps: float = 1e-6) -> list[ScoredSequence]:
    """The batch's sequences that carry a learning signal, each with its advantage."""
    found = []
    for group in groups:
        if group.get("inference_logprobs") is None:
            raise ValueError("a group without inference_logprobs: train on groups of a token-level policy")
        if len(set(group["scores"])) < 2:
            continue
        advantages = group_advantages(group["scores"], eps)
        overrides = group.get("overrides") or [{} for _ in advantages]
        for tokens, masks, logprobs, advantage, override in zip(
            group["tokens"], group["masks"], group["inference_logprobs"], advantages, overrides
        ):
            trainable = [i for i, mask in enumerate(masks) if mask != IGNORE_INDEX and i > 0]
            if trainable:
                found.append(
                    ScoredSequence(
                        tokens,
                        trainable,
                        [logprobs[i] for i in trainable],
                        advantage,
                        list((override or {}).get("policy_versions") or []),
                    )
                )
    return found


def shared_prefix(sequences: list[ScoredSequence]) -> int:
    """How many first tokens every sequence has in common, short of the first trainable one."""
    first = min(sequence.trainable[0] for sequence in sequences)
    shared = 0
    while shared < first - 1 and len({sequence.tokens[shared] for sequence in sequences}) == 1:
        shared += 1
    return shared


def token_logprobs(model, sequences: list[ScoredSequence]) -> list[torch.Tensor]:
    """log p(token) at each sequence's trainable positions, from one padded forward pass.

    The beginning the sequences share (a group's prompt) runs once: its keys and values
    are computed a single time and repeated for every sequence. Only the positions that
    predict trainable tokens go through the output layer: a full vocabulary of logits
    at every position would cost more than the model itself."""
    shared = shared_prefix(sequences)
    cache = None
    if shared:
        prefix = torch.tensor([sequences[0].tokens[:shared]])
        cache = model.base_model(input_ids=prefix, use_cache=True).past_key_values
        cache.batch_repeat_interleave(len(sequences))
    longest = max(len(s.tokens) for s in sequences) - shared
    ids = torch.zeros(len(sequences), longest, dtype=torch.long)
    attention = torch.ones(len(sequences), shared + longest, dtype=torch.long)
    for row, sequence in enumerate(sequences):
        rest = sequence.tokens[shared:]
        ids[row, : len(rest)] = torch.tensor(rest)
        attention[row, shared + len(rest) :] = 0
    hidden = model.base_model(
        input_ids=ids, attention_mask=attention, past_key_values=cache, use_cache=cache is not None
    ).last_hidden_state
    head = model.get_output_embeddings()
    found = []
    for row, sequence in enumerate(sequences):
        at = torch.tensor(sequence.trainable) - shared
        logits = head(hidden[row, at - 1]).float()
        found.append(torch.log_softmax(logits, dim=-1).gather(-1, ids[row, at, None])[:, 0])
    return found


def train_step(
    model,
    optimizer: torch.optim.Optimizer,
    groups: list[dict[str, Any]],
    *,
    clip: float = 0.2,
    micro_batch: int = 8,
    max_grad_norm: float = 1.0,
    eps: float = 1e-6,
    current_version: int | None = None,
) -> StepStats:
    """One GRPO step on `groups` (Atropos `ScoredDataGroup` dicts with `inference_logprobs`);
    `current_version`, the version of the weights being trained, picks the tokens of `current_gap_*`."""
    started = time.monotonic()
    rewards = [score for group in groups for score in group["scores"]]
    sequences = sequences_of(groups, eps)
    total_tokens = sum(len(s.trainable) for s in sequences)
    loss_sum, gaps, current_gaps, clipped = 0.0, [], [], 0
    optimizer.zero_grad(set_to_none=True)
    for start in range(0, len(sequences), micro_batch):
        chunk = sequences[start : start + micro_batch]
        chunk_loss = torch.zeros(())
        for sequence, new in zip(chunk, token_logprobs(model, chunk)):
            old = torch.tensor(sequence.inference_logprobs)
            ratio = torch.exp(new - old)
            objective = torch.minimum(ratio * sequence.advantage, ratio.clamp(1 - clip, 1 + clip) * sequence.advantage)
            chunk_loss = chunk_loss - objective.sum() / total_tokens
            gap = (new.detach() - old).abs().tolist()
            gaps.extend(gap)
            if current_version is not None and sequence.versions and set(sequence.versions) == {current_version}:
                current_gaps.extend(gap)
            clipped += int(((ratio.detach() - 1).abs() > clip).sum())
        chunk_loss.backward()
        loss_sum += chunk_loss.item()
    if sequences:
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
        optimizer.step()
    return StepStats(
        mean_reward=statistics.fmean(rewards),
        loss=loss_sum,
        sequences=len(sequences),
        tokens=total_tokens,
        logprob_gap_mean=statistics.fmean(gaps) if gaps else math.nan,
        logprob_gap_max=max(gaps, default=math.nan),
        clipped=clipped / total_tokens if total_tokens else 0.0,
        seconds=time.monotonic() - started,
        current_gap_mean=statistics.fmean(current_gaps) if current_gaps else math.nan,
        current_gap_max=max(current_gaps, default=math.nan),
        current_tokens=len(current_gaps),
    )


def save_and_publish(
    model, checkpoints: Path, step: int, policy_server: str, *, api_key: str | None = None, keep: int = 2
) -> Path:
    """Save the weights as `checkpoints/step-<step>` and have the server serve them as version `step`;
    older checkpoints beyond the last `keep` are deleted once the server holds the new ones."""
    folder = save_weights(model, checkpoints / f"step-{step:05d}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    response = httpx.post(
        f"{policy_server.rstrip('/')}/update_weights_from_disk",
        headers=headers,
        timeout=600,
        json={"model_path": str(folder.resolve()), "weight_version": str(step)},
    )
    answer = response.json()
    if not answer.get("success"):
        raise RuntimeError(f"the policy server refused step {step}'s weights: {answer.get('message', response.text)}")
    for old in sorted(checkpoints.glob("step-*"))[:-keep]:
        shutil.rmtree(old)
    return folder


THREADS_HELP = "torch threads, for the server and the trainer each (default: $OMP_NUM_THREADS, else 2)"


def default_threads() -> int:
    """torch's threads per process: $OMP_NUM_THREADS where the machine's owner set it (a machine that runs
    other work beside the trainer: torch's idle threads spin, and on busy cores that multiplies the CPU a
    step costs), else 2."""
    return int(os.environ.get("OMP_NUM_THREADS") or 2)


def load_policy(weights: Path | None = None):
    """The model the CPU policy server serves (float32, eval mode), with `weights` if given."""
    model = smollm2.load_model(smollm2.require_gguf())
    if weights is not None:
        load_into(model, read_state_dict(weights))
    return model


async def pull_batch(api, poll_s: float = 1.0) -> list[dict[str, Any]]:
    while (batch := await api.batch()) is None:
        await asyncio.sleep(poll_s)
    return batch


def fresh_groups(groups: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The groups to train on, and how many the door marked stale (`group_overrides.stale`) and are left out."""
    fresh = [g for g in groups if not (g.get("group_overrides") or {}).get("stale")]
    return fresh, len(groups) - len(fresh)


def train_from_door(args: argparse.Namespace) -> None:
    """Take, train, publish, acknowledge: one step per batch of the run `args.run`."""
    from temporal_rollouts.door.client import DoorClient

    torch.set_num_threads(args.threads)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    model = load_policy(args.weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    with DoorClient(args.door) as door:
        door.register(args.run, batch_size=args.batch_size, starting_step=args.first_step - 1)
        version = args.first_step - 1  # the weights being trained: the server's version before this step
        for batch in door.batches(args.run, lease_s=args.lease_s, trainer_version=lambda: version):
            step = version + 1
            groups, stale = fresh_groups(batch.groups)
            stats = train_step(model, optimizer, groups, clip=args.clip, current_version=version)
            stats.stale_skipped = stale
            save_and_publish(model, args.checkpoints, step, args.policy_server, api_key=api_key)
            batch.ack()  # after the server serves the new weights: the run counts versions by acknowledgements
            report(step, stats, args.stats)
            version = step
            if step >= args.first_step - 1 + args.steps:
                return
        print("the run is done: every batch it made is acknowledged", flush=True)


def report(step: int, stats: StepStats, path: Path | None) -> None:
    print(f"step {step:3d}  {stats.line()}", flush=True)
    if path:
        with open(path, "a") as out:
            out.write(json.dumps({"step": step, **asdict(stats)}) + "\n")


async def train_from_run_api(args: argparse.Namespace) -> None:
    from temporal_rollouts.sinks.atropos_api import TrajectoryApi

    torch.set_num_threads(args.threads)
    api_key = os.environ.get(args.api_key_env) if args.api_key_env else None
    model = load_policy(args.weights)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    async with TrajectoryApi(args.run_api) as api:
        await api.register_trainer(
            wandb_group="grpo-example",
            wandb_project="grpo-example",
            batch_size=args.batch_size,
            max_token_len=args.max_token_len,
            checkpoint_dir=str(args.checkpoints),
            save_checkpoint_interval=-1,
            starting_step=args.first_step - 1,
            num_steps=args.first_step - 1 + args.steps,
        )
        for step in range(args.first_step, args.first_step + args.steps):
            batch = await pull_batch(api)
            stats = train_step(model, optimizer, batch, clip=args.clip)
            save_and_publish(model, args.checkpoints, step, args.policy_server, api_key=api_key)
            report(step, stats, args.stats)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--door", default=None, help="the trainer door (rollouts train serve), with --run")
    parser.add_argument("--run", default=None, help="the training run to take batches from (its name)")
    parser.add_argument("--lease-s", type=float, default=600.0, help="how long a batch is leased to this trainer")
    parser.add_argument("--run-api", default="http://127.0.0.1:8000", help="Atropos' trajectory API (without --door)")
    parser.add_argument("--policy-server", default="http://127.0.0.1:30000", help="the CPU generate server")
    parser.add_argument(
        "--api-key-env", default=None, metavar="NAME", help="the environment variable holding the policy server's key"
    )
    parser.add_argument("--checkpoints", type=Path, default=Path("runs/grpo/checkpoints"))
    parser.add_argument("--weights", type=Path, default=None, help="start from this checkpoint (default: the GGUF)")
    parser.add_argument("--first-step", type=int, default=1, help="the version the first update publishes")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--batch-size", type=int, default=16, help="sequences per step, whole groups")
    parser.add_argument("--max-token-len", type=int, default=2048)
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument(
        "--threads", type=int, default=default_threads(), help="torch threads (default: $OMP_NUM_THREADS, else 2)"
    )
    parser.add_argument("--stats", type=Path, default=None, help="append each step's stats here")
    args = parser.parse_args(argv)
    if args.door:
        if not args.run:
            parser.error("--door needs --run NAME")
        train_from_door(args)
    else:
        asyncio.run(train_from_run_api(args))


if __name__ == "__main__":
    main()
