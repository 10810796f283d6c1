"""The integration fixtures: real dev server, sandbox processes, demo policy, worker."""

from tests.support.fixtures import *  # noqa: F403  (pytest finds fixtures by name)
