"""A user's shell for the end-to-end tests: one environment (its own ports and data folder) for
`python worker.py` and every command, and the worker running in it as a real process."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from tests.support import REPO
from tests.support.processes import kill_servers_under
from tests.support.servers.process import free_port

ROLLOUTS = Path(sys.executable).with_name("rollouts")


class Machine:
    """A user's shell: one environment for the worker and every command."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.temporal_port = free_port()
        self.env = {
            **os.environ,
            "ROLLOUTS_DATA_DIR": str(home / ".rollouts"),
            "ROLLOUTS_TEMPORAL__EMBEDDED_PORT": str(self.temporal_port),
            "ROLLOUTS_TEMPORAL__EMBEDDED_UI_PORT": str(free_port()),
            "ROLLOUTS_DEMO_POLICY__PORT": str(free_port()),
            # this checkout, as installed: its helper processes run `python -m temporal_rollouts....`
            "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
        }

    def run(
        self, *argv: str, timeout_s: float = 180, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            list(argv), cwd=self.home, env=env or self.env, capture_output=True, text=True, timeout=timeout_s
        )

    def rollouts_json(self, *args: str) -> dict | list:
        done = self.run(str(ROLLOUTS), *args, "--json")
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout)


def sft_policy(user: Machine) -> dict[str, str]:
    """The demo policy with a local tokenizer, `demo-sft`, in the user's settings: what a training run
    with no model server needs (template-rendered tokens)."""
    from temporal_rollouts.policy_servers import smollm2

    if smollm2.gguf_path() is None:
        return {}
    tokenizer = smollm2.export_tokenizer(user.home / "tokenizer")
    demo_url = f"http://127.0.0.1:{user.env['ROLLOUTS_DEMO_POLICY__PORT']}/v1"
    policy = {
        "type": "chat",
        "base_url": demo_url,
        "model": "demo-policy",
        "tokenizer": str(tokenizer),
        "chat_template": str(REPO / "tests" / "data" / "templates" / "qwen2_5.jinja"),
    }
    return {"ROLLOUTS_POLICIES": json.dumps({"demo-sft": policy})}


@contextlib.contextmanager
def worker_running(user: Machine, *args: str) -> Iterator[Path]:
    """`python worker.py ARGS` in the user's shell until it polls its task queue; its log's path. On the way
    out: the worker stopped, then the embedded server, sandboxes and demo policy (`rollouts server stop`)."""
    log = user.home / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [sys.executable, str(REPO / "worker.py"), *args],
            cwd=user.home,
            env=user.env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + 120
        while "worker polling task queue" not in log.read_text():
            assert worker.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        yield log
    finally:
        worker.terminate()
        worker.wait(60)
        user.run(str(ROLLOUTS), "server", "stop")
        kill_servers_under(user.home / ".rollouts")
