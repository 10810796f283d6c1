"""The synchronous proof that the stack trains: a batch of rollouts, one GRPO step, the new
weights served as the next version, repeat, with the reward printed at every step.

    python -m examples.grpo.sync_loop --steps 30 --out runs/grpo-sync

It starts what a user would: the CPU policy server, and `python worker.py` on its own
embedded dev server and local sandbox (ports and data folder of its own, under --out),
with the server as the token-level `sglang` policy `cpu`. The server has a key of its own
(drawn here, handed over in the environment variable `POLICY_KEY_ENV`, sent by the worker
and by this script) and loads weights only from --out/checkpoints, so no other local
process can read its requests or swap the weights a step is labelled with. Each step runs one
`BatchWorkflow` of `write_word` rollouts (one model turn each), reads the scored groups
from the batch's JSONL, trains `train_step` on them and publishes the weights with
`save_and_publish`. The next batch starts only once the server serves them, so every
token of a batch comes from the weights of the step before; the server's own record of
each request's version is checked to prove it. Rewards and stats go to --out/curve.jsonl.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import socket
import statistics
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import httpx
import torch

from envs import get_env
from examples.grpo.trainer import THREADS_HELP, default_threads, load_policy, save_and_publish, train_step
from temporal_rollouts.client.batches import start_batch
from temporal_rollouts.core.records import BatchInput, BatchResult, RolloutLimits, Sampling
from temporal_rollouts.core.settings import Settings
from temporal_rollouts.runtime.services import wait_for_port
from temporal_rollouts.runtime.temporal import connect, stop_dev_server
from temporal_rollouts.sandbox.backends.local import LocalBackend
from temporal_rollouts.sinks.jsonl import read_groups

REPO = Path(__file__).resolve().parents[2]
HOST = "127.0.0.1"
POLICY_KEY_ENV = "GRPO_POLICY_KEY"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def stack_environment(out: Path, server_url: str, slots: int) -> dict[str, str]:
    """The settings the worker and this script share, as ROLLOUTS_* variables."""
    policy = {
        "type": "sglang",
        "base_url": server_url,
        "tokenizer": str(out / "tokenizer"),
        "tool_call_parser": "hermes",
        "api_key_env": POLICY_KEY_ENV,
    }
    return {
        "ROLLOUTS_DATA_DIR": str(out / "rollouts"),
        "ROLLOUTS_TEMPORAL__EMBEDDED_PORT": str(free_port()),
        "ROLLOUTS_TEMPORAL__EMBEDDED_UI_PORT": str(free_port()),
        "ROLLOUTS_DEFAULT_POLICY": "cpu",
        "ROLLOUTS_POLICIES": json.dumps({"cpu": policy}),
        "ROLLOUTS_DEMO_POLICY__START_LOCAL": "false",
        "ROLLOUTS_SANDBOX__SLOTS_PER_CONTAINER": str(slots),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


class Stack:
    """The CPU policy server and `python worker.py` (which starts its embedded dev server and
    sandbox), on ports of their own; `close` stops all of it, whatever state it is in."""

    def __init__(self, out: Path, threads: int, slots: int) -> None:
        self.out, self.threads = out, threads
        self.port = free_port()
        self.server_url = f"http://{HOST}:{self.port}"
        shared = stack_environment(out, self.server_url, slots)
        os.environ.update(shared)
        self.key = os.environ.setdefault(POLICY_KEY_ENV, secrets.token_urlsafe(32))
        self.settings = Settings()
        self.env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.processes: list[subprocess.Popen] = []

    def _start(self, argv: list[str], log: Path) -> subprocess.Popen:
        with open(log, "ab") as out:
            self.processes.append(subprocess.Popen(argv, cwd=REPO, env=self.env, stdout=out, stderr=subprocess.STDOUT))
        return self.processes[-1]

    def start(self) -> None:
        server_log, worker_log = self.out / "policy_server.log", self.out / "worker.log"
        server = self._start(
            [
                sys.executable,
                "-m",
                "temporal_rollouts.policy_servers.cpu_generate",
                "--port",
                str(self.port),
                "--tokenizer-out",
                str(self.out / "tokenizer"),
                "--threads",
                str(self.threads),
                "--api-key-env",
                POLICY_KEY_ENV,
                "--weights-dir",
                str(self.out / "checkpoints"),
            ],
            server_log,
        )
        wait_for_port(HOST, self.port, server, "the CPU policy server", server_log, wait_s=600)
        worker = self._start([sys.executable, str(REPO / "worker.py")], worker_log)
        deadline = time.monotonic() + 300
        while "worker polling task queue" not in worker_log.read_text(errors="replace"):
            if worker.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the worker did not start; see {worker_log}")
            time.sleep(0.5)

    def start_door(self) -> str:
        """The trainer door's endpoint (`python -m temporal_rollouts.door`) on a port of its own; its URL."""
        port = free_port()
        log = self.out / "door.log"
        door = self._start([sys.executable, "-m", "temporal_rollouts.door", "--port", str(port)], log)
        wait_for_port(HOST, port, door, "the door's endpoint", log, wait_s=120)
        return f"http://{HOST}:{port}"

    def close(self) -> None:
        for proc in reversed(self.processes):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(60)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        stop_dev_server(self.settings)
        asyncio.run(self._stop_sandboxes())

    async def _stop_sandboxes(self) -> None:
        backend = LocalBackend.from_settings(self.settings)
        for container in await backend.list_containers():
            await backend.stop_container(container.container_id)


def served_versions(server_url: str, key: str) -> set[str]:
    """The weight versions the server reports for the requests since the last call, then forgets them."""
    headers = {"Authorization": f"Bearer {key}"}
    records = httpx.get(f"{server_url}/requests", headers=headers, timeout=60).raise_for_status().json()
    httpx.post(f"{server_url}/requests/reset", headers=headers, timeout=60).raise_for_status()
    return {record["weight_version"] for record in records}


async def run(args: argparse.Namespace, out: Path, stack: Stack) -> None:
    torch.set_num_threads(args.threads)
    model = load_policy()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.0)
    curve: list[float] = []
    task_count = get_env("write_word").item_count()
    settings, server_url = stack.settings, stack.server_url
    client = await connect(settings, start_embedded=False)
    served_versions(server_url, stack.key)
    for step in range(1, args.steps + 1):
        started = time.monotonic()
        batch = BatchInput(
            env="write_word",
            num_items=args.items,
            group_size=args.group_size,
            item_offset=((step - 1) * args.items) % task_count,
            policy="cpu",
            max_concurrency=args.items * args.group_size,
            cycle_items=True,
            sampling=Sampling(temperature=args.temperature, max_tokens=args.max_tokens),
            limits=RolloutLimits(max_turns=1),
        )
        handle = await start_batch(client, settings, batch, f"grpo-sync-{out.name}-{step:03d}-{int(time.time())}")
        result: BatchResult = await handle.result()
        rolled = time.monotonic()
        versions = served_versions(server_url, stack.key)
        expected = "default" if step == 1 else str(step - 1)
        if versions != {expected}:
            raise RuntimeError(f"step {step}: tokens from versions {sorted(versions)}, expected only {expected}")
        groups = read_groups(Path(result.output)) if result.output else []
        stats = train_step(model, optimizer, groups, clip=args.clip)
        trained = time.monotonic()
        save_and_publish(model, out / "checkpoints", step, server_url, api_key=stack.key)
        published = time.monotonic()
        curve.append(stats.mean_reward)
        print(
            f"step {step:3d}  v{expected:>7}  {stats.line()}  rollouts {rolled - started:.0f}s  "
            f"publish {published - trained:.0f}s  failed {result.failed}",
            flush=True,
        )
        with open(out / "curve.jsonl", "a") as log:
            log.write(
                json.dumps(
                    {
                        "step": step,
                        "served_version": expected,
                        **asdict(stats),
                        "rollout_s": rolled - started,
                        "publish_s": published - trained,
                        "failed": result.failed,
                    }
                )
                + "\n"
            )
    if len(curve) >= 10:
        first, last = statistics.fmean(curve[:5]), statistics.fmean(curve[-5:])
        print(f"mean reward, first 5 steps {first:.3f}, last 5 steps {last:.3f} ({last - first:+.3f})")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("runs/grpo-sync"), help="logs, rollouts, checkpoints, curve")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--items", type=int, default=2, help="write_word tasks per step")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per task")
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-tokens", type=int, default=48, help="tokens per model turn")
    parser.add_argument("--lr", type=float, default=1e-5)
    parser.add_argument("--clip", type=float, default=0.2)
    parser.add_argument("--threads", type=int, default=default_threads(), help=THREADS_HELP)
    args = parser.parse_args(argv)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    interrupt_on_signals()
    stack = Stack(out, args.threads, args.items * args.group_size)
    try:
        stack.start()
        asyncio.run(run(args, out, stack))
    finally:
        stack.close()


def interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt at once, even mid-step, so the stack's `close` runs."""
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(signal.Signals(signum).name)


if __name__ == "__main__":
    main()
