"""TRL's GRPOTrainer, unpatched, training SmolLM2-135M on CPU from the trainer door.

    python -m examples.trl_grpo.train --steps 12 --out runs/trl-grpo

TRL (`trl` 1.16) lets a trainer bring its own rollouts through `rollout_func`: a function that
receives the step's prompts and returns, per completion, `prompt_ids`, `completion_ids` and
`logprobs`, with an `env_mask` for tokens the model did not generate and any other field passed
on to the reward functions. That is exactly what a door batch carries, so the rollouts (here
`write_word` through the real worker and sandbox, one model turn each) come from the project and
TRL does only the optimisation:

- `DoorRollouts` is the `rollout_func`: it takes the run's next batch through the door's Python
  client; each group of the batch stands for one of TRL's prompts, which TRL hands over repeated
  `num_generations` (= group size) times, one completion each: the tokens before the first
  trained one are the prompt, the rest the completion (`env_mask` 0 where the mask is -100), the
  score goes to TRL as a field `score`;
- `score_reward` is TRL's reward function: it hands back the env's score;
- `PublishAndAcknowledge` is a TRL callback: after each optimizer step it saves the weights, has
  the CPU policy server serve them as version `step` and acknowledges the batch, so the run's
  admission and staleness bound count TRL's steps.

The stack is the one `examples/grpo/sync_loop.py` starts (the CPU policy server, `python
worker.py` with its embedded dev server and sandbox), plus the door's endpoint and one training
run with `max_staleness 0`: a batch's rollouts start only once the previous batch is acknowledged,
so every token was sampled by the weights TRL trains. That matters: TRL uses the rollouts'
logprobs only with vLLM (its importance-sampling correction); without it, it treats them as
on-policy. Rewards go to `--out/curve.jsonl` and `--out/reward.png`, one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import uuid
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is marked experimental in TRL 1.16

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from transformers import AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from examples.grpo.sync_loop import Stack, interrupt_on_signals  # noqa: E402
from examples.grpo.trainer import THREADS_HELP, default_threads, load_policy, save_and_publish  # noqa: E402
from temporal_rollouts.door.client import Batch, DoorClient  # noqa: E402

IGNORE_INDEX = -100


class DoorRollouts:
    """TRL's `rollout_func`: the run's next batch, as TRL's prompts and completions."""

    def __init__(self, door: DoorClient, run: str, lease_s: float = 3600.0) -> None:
        self.door, self.run, self.lease_s = door, run, lease_s
        self.version = 0
        """The version of the weights TRL trains now: 0 until its first step is published."""
        self.batch: Batch | None = None

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, list]:
        while (batch := self.door.take(self.run, lease_s=self.lease_s, trainer_version=self.version)) is None:
            time.sleep(0.5)
        sequences = batch.sequences()
        if len(sequences) != len(prompts):  # TRL's prompts come repeated, `num_generations` times each
            raise ValueError(
                f"batch {batch.number} has {len(sequences)} sequences for TRL's {len(prompts)} completions"
            )
        self.batch = batch
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "score": []}
        for sequence in sequences:
            trained = sequence.trainable()
            start = trained[0] if trained else len(sequence.tokens) - 1
            out["prompt_ids"].append(sequence.tokens[:start])
            out["completion_ids"].append(sequence.tokens[start:])
            out["env_mask"].append([int(mask != IGNORE_INDEX) for mask in sequence.masks[start:]])
            out["logprobs"].append(
                [
                    lp if mask != IGNORE_INDEX else 0.0
                    for lp, mask in zip(sequence.logprobs[start:], sequence.masks[start:])
                ]
            )
            out["score"].append(sequence.score)
        return out


def score_reward(completions: list, score: list[float], **kwargs: Any) -> list[float]:
    """The env's score of each rollout (verified in its sandbox), handed to TRL as its reward."""
    return [float(s) for s in score]


class PublishAndAcknowledge(TrainerCallback):
    """After each optimizer step: the weights served as version `step`, then the batch acknowledged."""

    def __init__(self, rollouts: DoorRollouts, policy_url: str, policy_key: str | None, out: Path) -> None:
        self.rollouts, self.policy_url, self.policy_key, self.out = rollouts, policy_url, policy_key, out
        self.rewards: list[float] = []

    def on_step_end(self, args, state, control, model=None, **kwargs) -> None:
        batch = self.rollouts.batch
        assert batch is not None and model is not None
        step = state.global_step
        save_and_publish(model, self.out / "checkpoints", step, self.policy_url, api_key=self.policy_key)
        batch.ack()
        self.rollouts.version = step
        reward = statistics.fmean(batch.scores)
        self.rewards.append(reward)
        line = {"step": step, "batch": batch.number, "reward": reward, "trained_version": step - 1}
        with open(self.out / "curve.jsonl", "a") as log:
            log.write(json.dumps(line) + "\n")
        print(f"step {step:3d}  batch {batch.number:3d}  reward {reward:.3f}", flush=True)


def plot(rewards: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot

    steps = list(range(1, len(rewards) + 1))
    figure, axes = pyplot.subplots(figsize=(7, 3.6), dpi=120)
    axes.plot(steps, rewards, marker="o", markersize=3, linewidth=1, label="mean reward of the step's batch")
    if len(rewards) >= 5:
        smooth = [statistics.fmean(rewards[max(0, i - 4) : i + 1]) for i in range(len(rewards))]
        axes.plot(steps, smooth, linewidth=2, label="mean of the last 5 steps")
    axes.set(xlabel="TRL step", ylabel="reward", ylim=(0, 1.05), title=title)
    axes.title.set_fontsize(9)
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower right")
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)


def trl_config(args: argparse.Namespace, out: Path) -> GRPOConfig:
    per_step = args.group_size * args.groups_per_step
    return GRPOConfig(
        output_dir=str(out / "trl"),
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=per_step,
        gradient_accumulation_steps=1,
        num_generations=args.group_size,
        max_steps=args.steps,
        learning_rate=args.lr,
        beta=0.0,  # no reference model, as in examples/grpo
        max_completion_length=args.max_tokens,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        dataloader_num_workers=0,
        seed=0,
    )


def train(args: argparse.Namespace, out: Path, stack: Stack) -> dict:
    import asyncio

    from temporal_rollouts.client.training import start_feed
    from temporal_rollouts.core.feed import FeedInput
    from temporal_rollouts.core.records import RolloutLimits, Sampling
    from temporal_rollouts.runtime.temporal import connect

    door_url = stack.start_door()
    run = f"trl-grpo-{uuid.uuid4().hex[:6]}"
    feed = FeedInput(
        env="write_word",
        policy="cpu",
        group_size=args.group_size,
        batch_size=args.group_size * args.groups_per_step,
        max_staleness=0,
        max_groups=args.steps * args.groups_per_step,
        sampling=Sampling(temperature=1.0, max_tokens=args.max_tokens),
        limits=RolloutLimits(max_turns=1),
    )

    async def start() -> None:
        client = await connect(stack.settings, start_embedded=False)
        await start_feed(client, stack.settings, run, feed)

    asyncio.run(start())
    torch.set_num_threads(args.threads)
    tokenizer = AutoTokenizer.from_pretrained(out / "tokenizer")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    prompts = Dataset.from_dict({"prompt": [f"(group {i}: the door's run decides)" for i in range(args.steps * 64)]})
    with DoorClient(door_url) as door:
        rollouts = DoorRollouts(door, run)
        callback = PublishAndAcknowledge(rollouts, stack.server_url, stack.key, out)
        trainer = GRPOTrainer(
            model=load_policy(),  # plain float32 (smollm2.converted): Trainer fine-tunes it as it is
            reward_funcs=score_reward,
            args=trl_config(args, out),
            train_dataset=prompts,
            processing_class=tokenizer,
            rollout_func=rollouts,
            callbacks=[callback],
        )
        trainer.train()
        status = door.status(run)
    rewards = callback.rewards
    window = min(5, len(rewards))
    first, last = statistics.fmean(rewards[:window]), statistics.fmean(rewards[-window:])
    plot(
        rewards,
        out / "reward.png",
        f"write_word, SmolLM2-135M, TRL GRPOTrainer from the door, {args.group_size} x {args.groups_per_step} "
        f"rollouts/step\nfirst {window} {first:.2f} -> last {window} {last:.2f}",
    )
    door_figures = status["door"]["figures"]
    report = {
        "example": "trl_grpo",
        "trl": __import__("trl").__version__,
        "steps": len(rewards),
        "rewards": [round(r, 4) for r in rewards],
        "first_mean": round(first, 4),
        "last_mean": round(last, 4),
        "gain": round(last - first, 4),
        "batches_acknowledged": door_figures["batches_acknowledged"],
        "staleness_at_consumption": door_figures["staleness"],
        "plot": str(out / "reward.png"),
    }
    print(f"reward: first {window} steps {first:.3f}, last {window} steps {last:.3f} ({last - first:+.3f})")
    print(json.dumps(report))
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/trl-grpo"), help="logs, checkpoints, curve, plot")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument(
        "--group-size", type=int, default=8, help="rollouts per write_word task (TRL's num_generations)"
    )
    parser.add_argument("--groups-per-step", type=int, default=2, help="tasks per step (TRL's prompts)")
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per model turn")
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--threads", type=int, default=default_threads(), help=THREADS_HELP)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    interrupt_on_signals()
    stack = Stack(out, args.threads, args.group_size * args.groups_per_step)
    try:
        stack.start()
        train(args, out, stack)
    finally:
        stack.close()


if __name__ == "__main__":
    main()
