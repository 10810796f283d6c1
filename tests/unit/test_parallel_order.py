"""The order xdist hands modules out in (`tests/support/parallel.py`): the longest modules first, then the
other slow ones, each module's tests kept in their order."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.support import parallel


@dataclass
class FakeItem:
    path: Path
    name: str
    slow: bool = False

    def get_closest_marker(self, name: str) -> object | None:
        return object() if name == "slow" and self.slow else None


def test_every_module_named_longest_exists() -> None:
    missing = [name for name in parallel.LONGEST_FIRST if not (parallel.TESTS / name).is_file()]
    assert missing == [], "a module of LONGEST_FIRST was renamed or removed"


def test_the_longest_go_first_in_their_order_then_the_slow_then_the_rest() -> None:
    first, second = (parallel.TESTS / name for name in parallel.LONGEST_FIRST[:2])
    quick, slow = parallel.TESTS / "unit" / "test_a.py", parallel.TESTS / "integration" / "test_b.py"
    items = [
        FakeItem(quick, "q1"),
        FakeItem(slow, "s1"),
        FakeItem(slow, "s2", slow=True),
        FakeItem(second, "b1"),
        FakeItem(first, "a1"),
        FakeItem(first, "a2"),
        FakeItem(quick, "q2"),
    ]
    parallel.slow_modules_first(items)
    assert [item.name for item in items] == ["a1", "a2", "b1", "s1", "s2", "q1", "q2"]
