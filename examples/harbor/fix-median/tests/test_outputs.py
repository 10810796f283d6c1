import sys

sys.path.insert(0, "/app")
sys.dont_write_bytecode = True

from stats import median  # noqa: E402


def test_odd():
    assert median([5, 1, 3]) == 3


def test_even():
    assert median([10, 1, 4, 2]) == 3.0


def test_one():
    assert median([7]) == 7


def test_unsorted_floats():
    assert median([2.5, -1.0, 9.0, 0.5]) == 1.5
