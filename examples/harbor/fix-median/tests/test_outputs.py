"""Each case calls the agent's `median` in a child process and compares what it prints: the agent's code
never runs inside this process, so it cannot change how the tests end."""

import subprocess
import sys

import pytest

CASES = [([5, 1, 3], 3), ([10, 1, 4, 2], 3.0), ([7], 7), ([2.5, -1.0, 9.0, 0.5], 1.5)]


def median_of(values):
    code = f"import sys; sys.path.insert(0, '/app'); from stats import median; print(repr(median({values!r})))"
    done = subprocess.run(
        [sys.executable, "-I", "-c", code], capture_output=True, text=True, timeout=30, cwd="/tmp", check=False
    )
    assert done.returncode == 0, done.stderr[-500:]
    return done.stdout.strip().splitlines()[-1]


@pytest.mark.parametrize(("values", "expected"), CASES)
def test_median(values, expected):
    assert median_of(values) == repr(expected)
