"""Fixtures every tier may use: the real-model fixtures (SmolLM2 behind /generate), which start
nothing until a test asks for them. The integration fixtures (dev server, sandbox, demo
policy, worker) are in tests/support/fixtures.py, loaded by the integration and end-to-end tiers.

The session also gets a temp folder of its own (`tests/support/tempdir.py`): what any test or any
process it started leaves there fails the run. Under pytest-xdist each worker process has its own
folder inside the controller's and sends the controller what it left there.

How the suite runs in parallel, and what a test shares with others on the host (`host_lock`):
tests/support/parallel.py and tests/README.md."""

import os
import sys
from collections.abc import Iterator

# One torch thread in every process the tests start (servers, trainers, this one): the test workers
# share two cores, and torch's idle threads spin. Three processes of two threads each on two cores
# took 7x the CPU and the wall time of the same work with one thread each (tests/README.md).
os.environ["OMP_NUM_THREADS"] = "1"
# Bytecode is written, whatever the machine's environment says: otherwise every process the tests
# start compiles the project's modules again (about 0.35 s of CPU for a worker's imports), and each
# test worker re-rewrites every test module's asserts (tests/README.md).
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
sys.dont_write_bytecode = False

import pytest  # noqa: E402

from tests.support import parallel
from tests.support.servers.fixtures import (  # noqa: F401  (fixtures, shared by every module)
    own_smollm2_server,
    smollm2_gguf,
    smollm2_model,
    smollm2_process,
    smollm2_server,
    smollm2_tokenizer,
    smollm2_tokenizer_dir,
)
from tests.support.tempdir import SessionTemp, report, with_workers

SESSION_TEMP = SessionTemp()
"""Made when pytest loads this file, before any test or fixture runs and before pytest picks its own
temp folder, so everything under test inherits it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if parallel.in_worker(config):
        parallel.slow_modules_first(items)


@pytest.fixture(autouse=True)
def _host_locks(request: pytest.FixtureRequest) -> Iterator[None]:
    """The test's `host_lock` names, held while it runs (tests/support/parallel.py)."""
    with parallel.host_locks(parallel.lock_names(request.node)):
        yield


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if (scratch := sys.modules.get("envs.swe_smith.scratch")) is not None:
        scratch.PROCESS_FOLDER.remove()  # what this process removes at its exit, which comes after this check
    from envs.swe_smith.scratch import sweep

    sweep(SESSION_TEMP.folder)  # what the next worker would sweep: build folders of processes a test SIGKILLed
    leftovers = SESSION_TEMP.leftovers()
    if (sent := getattr(session.config, "workeroutput", None)) is not None:  # an xdist worker: its controller tells
        sent[WORKER_TEMP] = {"folder": SESSION_TEMP.folder.name, "leftovers": leftovers}
        return
    leftovers = with_workers(leftovers, session.config.stash.get(WORKERS_LEFT, {}))
    if leftovers:
        session.config.stash[LEFT_OVER] = report(leftovers, SESSION_TEMP.folder)
        if exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """An xdist worker ended (on the controller): keep what it left in its temp folder."""
    if (sent := getattr(node, "workeroutput", {}).get(WORKER_TEMP)) is not None:
        node.config.stash.setdefault(WORKERS_LEFT, {})[sent["folder"]] = sent["leftovers"]


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if (said := config.stash.get(LEFT_OVER, None)) is not None:
        terminalreporter.section("temp dir", sep="=", red=True, bold=True)
        terminalreporter.line(said, red=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    SESSION_TEMP.restore()
    SESSION_TEMP.remove()


LEFT_OVER = pytest.StashKey[str]()
WORKERS_LEFT = pytest.StashKey[dict[str, list[str]]]()
WORKER_TEMP = "rollouts_temp"
"""The key under which an xdist worker sends its controller its temp folder's name and what it left there."""
