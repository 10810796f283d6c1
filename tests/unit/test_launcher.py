"""The resident launcher's server side, where it needs no sandbox (the rest: tests/integration/test_resident_launcher.py)."""

from __future__ import annotations

import fcntl
import os
import resource

import pytest

from temporal_rollouts.sandbox_server.isolation.launcher import _readable


def test_a_pidfd_check_works_past_fd_1023():
    """A server with 200 slots holds well over 1,024 fds; select() raised ValueError there and the
    command failed as a server error (found by bench/orchestration.py at 200 at once)."""
    if resource.getrlimit(resource.RLIMIT_NOFILE)[0] < 2100:
        pytest.skip("this process may not open fd 2000")
    read, write = os.pipe()
    high = fcntl.fcntl(read, fcntl.F_DUPFD, 2000)
    try:
        assert not _readable(high)
        os.write(write, b"x")
        assert _readable(high)
    finally:
        for fd in (read, write, high):
            os.close(fd)
