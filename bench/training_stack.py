"""Every process of a training run on this machine, each one killable: what bench/feed.py and
bench/train_loop.py run against.

The Temporal dev server (in-memory SQLite), the trainer door's endpoint, Atropos' real `run-api`, the CPU policy server
(SmolLM2 behind SGLang's `/generate`, with weight updates), the demo policy (which steers the
tiny model's tool calls where a task needs it), a local sandbox container, `python worker.py`,
and the Atropos env's `serve` attached to the run. `kill_*` send SIGKILL (a crashed machine:
no drain), `start_*` bring a process back; the worker's sandbox pool restarts a killed sandbox
server in place by itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml
from temporalio.client import Client

from bench.procs import REPO, _env_vars, _spawn, _stop, _wait_for_line, free_port, temporal_dev_server
from temporal_rollouts.core.settings import GeneratePolicy, Settings
from temporal_rollouts.runtime.services import wait_for_port
from temporal_rollouts.sandbox.backends.local import LocalBackend

TASK_QUEUE = "bench-training"
POLICY = "smol"
MODEL_LOAD_S = 600.0
POLICY_KEY_ENV = "BENCH_POLICY_KEY"
"""The policy server's key travels in this variable: to the server, the worker and the env's serve."""


@dataclass
class TrainingStack:
    data_dir: Path
    settings: Settings
    client: Client
    run_api_url: str
    policy_url: str
    tokenizer_dir: Path
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    policy_port: int = 0
    policy_args: list[str] = field(default_factory=list)
    kills: dict[str, int] = field(default_factory=dict)
    policy_key: str = field(default_factory=lambda: os.environ.setdefault(POLICY_KEY_ENV, secrets.token_urlsafe(32)))

    @property
    def policy_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.policy_key}"}

    door_port: int = 0

    @property
    def door_url(self) -> str:
        return f"http://127.0.0.1:{self.door_port}"

    def env_vars(self) -> dict[str, str]:
        policy = self.settings.policies[POLICY].model_dump_json()
        return {
            **_env_vars(self.settings),
            "ROLLOUTS_POLICIES": f'{{"{POLICY}": {policy}}}',
            "ROLLOUTS_ATROPOS__API_URL": self.run_api_url,
            "HF_HUB_OFFLINE": "1",
            "ROLLOUTS_SANDBOX__START_LOCAL": "true",
            POLICY_KEY_ENV: self.policy_key,
        }  # the worker starts (and restarts) the sandbox itself

    async def start_worker(self) -> None:
        log = self.data_dir / "worker.log"
        proc = _spawn([sys.executable, "worker.py"], log, env=self.env_vars())
        self.processes["worker"] = proc
        await _wait_for_line(log, "worker polling", proc, wait_s=120)

    async def start_door(self) -> None:
        """The trainer door's endpoint (`python -m temporal_rollouts.door`): stateless, so killed and started
        again it serves the same runs."""
        log = self.data_dir / "door.log"
        proc = _spawn(
            [sys.executable, "-m", "temporal_rollouts.door", "--port", str(self.door_port)], log, env=self.env_vars()
        )
        self.processes["door"] = proc
        await asyncio.to_thread(wait_for_port, "127.0.0.1", self.door_port, proc, "the door", log, 60)

    def kill(self, role: str) -> None:
        proc = self.processes.get(role)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
            self.kills[role] = self.kills.get(role, 0) + 1

    def kill_sandbox(self) -> None:
        """SIGKILL the sandbox server: the worker's pool finds it dead and restarts it in place."""
        backend = LocalBackend.from_settings(self.settings)
        for info in backend.registry.load():
            if info.pid:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(info.pid, signal.SIGKILL)
        self.kills["sandbox"] = self.kills.get("sandbox", 0) + 1

    async def start_policy(self) -> None:
        log = self.data_dir / "policy_server.log"
        proc = _spawn(
            [
                sys.executable,
                "-m",
                "temporal_rollouts.policy_servers.cpu_generate",
                "--port",
                str(self.policy_port),
                "--tokenizer-out",
                str(self.tokenizer_dir),
                "--api-key-env",
                POLICY_KEY_ENV,
                "--weights-dir",
                str(self.data_dir),
                *self.policy_args,
            ],
            log,
            env={
                **os.environ,
                POLICY_KEY_ENV: self.policy_key,
                "HF_HUB_OFFLINE": "1",
                "TOKENIZERS_PARALLELISM": "false",
                "PYTHONPATH": str(REPO),
            },
        )
        self.processes["policy_server"] = proc
        await asyncio.to_thread(wait_for_port, "127.0.0.1", self.policy_port, proc, "policy server", log, MODEL_LOAD_S)

    def start_env(self, run: str, **fields: object) -> None:
        """The Atropos env's `serve`, attached to the run `run` (it starts it if it does not run)."""
        config = {
            "task_env": "echo_chain",
            "policy": POLICY,
            "use_wandb": False,
            "wandb_name": run,
            "run_name": run,
            "rollout_server_url": self.run_api_url,
            "total_steps": 10**6,
            "tokenizer_name": str(self.tokenizer_dir),
            **fields,
        }
        path = self.data_dir / "env.yaml"
        path.write_text(yaml.safe_dump({"env": config}))
        argv = [sys.executable, "-m", "temporal_rollouts.integrations.atropos.env", "serve", "--config", str(path)]
        self.processes["env"] = _spawn(
            argv, self.data_dir / "env.log", env={**self.env_vars(), "WANDB_MODE": "disabled"}
        )

    async def update_weights(self, folder: Path, version: int) -> None:
        async with httpx.AsyncClient(timeout=600) as http:
            answer = (
                await http.post(
                    f"{self.policy_url}/update_weights_from_disk",
                    headers=self.policy_headers,
                    json={"model_path": str(folder), "weight_version": str(version)},
                )
            ).json()
        if not answer.get("success"):
            raise RuntimeError(f"the policy server refused version {version}: {answer}")


async def served_weights_on_disk(data_dir: Path) -> Path:
    """The served model's own weights saved under `data_dir/weights`: what a stand-in trainer publishes as each
    new version (the weights stay the same; the versions and the server's reloads are what is exercised)."""
    from temporal_rollouts.policy_servers import smollm2
    from temporal_rollouts.policy_servers.weights import save_weights

    model = await asyncio.to_thread(smollm2.load_model, smollm2.require_gguf())
    return await asyncio.to_thread(save_weights, model, data_dir / "weights")


@contextlib.asynccontextmanager
async def training_stack(
    data_dir: Path,
    *,
    slots: int,
    steered: bool,
    chat_template: Path | None = None,
    policy_args: tuple[str, ...] = (),
) -> AsyncIterator[TrainingStack]:
    """Everything up and the worker polling; `steered` makes the demo policy write the start of every
    turn (the tiny model cannot choose tools alone), leaving the model the rest of it."""
    async with contextlib.AsyncExitStack() as stack:
        demo_port = free_port()
        demo = _spawn(
            [sys.executable, "-m", "temporal_rollouts.policy_servers.demo", "--port", str(demo_port)],
            data_dir / "demo_policy.log",
        )
        stack.callback(_stop, demo)
        run_api_port = free_port()
        run_api = _spawn(
            [str(Path(sys.executable).parent / "run-api"), "--host", "127.0.0.1", "--port", str(run_api_port)],
            data_dir / "run_api.log",
        )
        stack.callback(_stop, run_api)
        env, _ = await stack.enter_async_context(temporal_dev_server(data_dir))
        policy_port = free_port()
        settings = Settings(
            data_dir=data_dir,
            temporal={"address": env.client.service_client.config.target_host, "task_queue": TASK_QUEUE},
            demo_policy={"port": demo_port, "start_local": False},
            sandbox={"slots_per_container": slots, "max_containers": 1},
            worker={"graceful_shutdown_s": 2.0},
            atropos={"api_url": f"http://127.0.0.1:{run_api_port}"},
            policies={
                POLICY: GeneratePolicy(
                    type="sglang",
                    base_url=f"http://127.0.0.1:{policy_port}",
                    tokenizer=str(data_dir / "tokenizer"),
                    chat_template=str(chat_template) if chat_template else None,  # SmolLM2's: found by itself
                    prefill_from="demo" if steered else None,
                    timeout_s=120,
                    api_key_env=POLICY_KEY_ENV,
                )
            },
        )
        training = TrainingStack(
            data_dir,
            settings,
            env.client,
            settings.atropos.api_url,
            f"http://127.0.0.1:{policy_port}",
            data_dir / "tokenizer",
            policy_port=policy_port,
            policy_args=list(policy_args),
        )
        training.door_port = free_port()
        for role in ("env", "worker", "policy_server", "door"):
            stack.callback(lambda role=role: _stop(training.processes[role]) if role in training.processes else None)
        stack.push_async_callback(LocalBackend.from_settings(settings).shutdown)
        await asyncio.to_thread(
            wait_for_port, "127.0.0.1", demo_port, demo, "demo policy", data_dir / "demo_policy.log"
        )
        await asyncio.to_thread(
            wait_for_port, "127.0.0.1", run_api_port, run_api, "run-api", data_dir / "run_api.log", 120
        )
        await training.start_policy()
        await training.start_worker()
        await training.start_door()
        yield training
