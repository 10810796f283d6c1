fail() { echo "FAIL: $*"; exit 1; }
python3 -I -c 'import pytest' 2>/dev/null || fail "pytest is not installed: this task runs in its own image"
mkdir -p /tmp/check && cat > /tmp/check/test_check.py <<'PY'
import importlib.util
import random

spec = importlib.util.spec_from_file_location("stats", "/workspace/stats.py")
stats = importlib.util.module_from_spec(spec)
spec.loader.exec_module(stats)


def test_odd():
    assert stats.median([3, 1, 2]) == 2


def test_even():
    assert stats.median([4, 1, 3, 2]) == 2.5


def test_many():
    rng = random.Random(7)
    for _ in range(50):
        values = [rng.randint(-100, 100) for _ in range(rng.randint(1, 20))]
        ordered, n = sorted(values), len(values)
        expected = ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2
        assert stats.median(values) == expected
PY
cd /tmp/check && python3 -m pytest -q -p no:cacheprovider test_check.py || fail "the tests fail"
