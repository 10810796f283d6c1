"""Fixtures every tier may use: the real-model fixtures (SmolLM2 behind /generate), which start
nothing until a test asks for them. The integration fixtures (dev server, sandbox, demo
policy, worker) are in tests/support/fixtures.py, loaded by the integration and end-to-end tiers.

The session also gets a temp folder of its own (`tests/support/tempdir.py`): what any test or any
process it started leaves there fails the run."""

import sys

import pytest

from tests.support.servers.fixtures import (  # noqa: F401  (fixtures, shared by every module)
    own_smollm2_server,
    smollm2_gguf,
    smollm2_model,
    smollm2_process,
    smollm2_server,
    smollm2_tokenizer,
)
from tests.support.tempdir import SessionTemp, report

SESSION_TEMP = SessionTemp()
"""Made when pytest loads this file, before any test or fixture runs and before pytest picks its own
temp folder, so everything under test inherits it."""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if (scratch := sys.modules.get("envs.swe_smith.scratch")) is not None:
        scratch.PROCESS_FOLDER.remove()  # what this process removes at its exit, which comes after this check
    leftovers = SESSION_TEMP.leftovers()
    if leftovers:
        session.config.stash[LEFT_OVER] = report(leftovers, SESSION_TEMP.folder)
        if exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    if (said := config.stash.get(LEFT_OVER, None)) is not None:
        terminalreporter.section("temp dir", sep="=", red=True, bold=True)
        terminalreporter.line(said, red=True)


def pytest_unconfigure(config: pytest.Config) -> None:
    SESSION_TEMP.restore()
    SESSION_TEMP.remove()


LEFT_OVER = pytest.StashKey[str]()
