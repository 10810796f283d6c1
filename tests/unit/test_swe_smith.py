"""The swe_smith env's pure parts: bug rewrites, pytest summaries, instance files, config, reward."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from envs import get_env
from envs.swe_smith.config import SweSmithConfig
from envs.swe_smith.grader.grade import chunks
from envs.swe_smith.grading import shaped_reward
from envs.swe_smith.loader import read_instances, selected_ids
from envs.swe_smith.mutations import candidate_mutations
from envs.swe_smith.grader.pytest_summary import parse_summary
from temporal_rollouts.core.errors import ConfigError
from temporal_rollouts.core.tasks import Item

MODULE = """\
def f(a, b):
    total = 0  # start
    if a is not None and b > 2:
        total += a[1:b]
    for i in range(len(a)):
        total = g(a, b) - i
    return total == (b)
"""


def changed_lines(kind: str) -> list[tuple[str, str]]:
    pairs = []
    for mutation in candidate_mutations("m.py", MODULE):
        if mutation.kind == kind:
            old = [line for line in MODULE.splitlines() if line not in mutation.new_source.splitlines()]
            new = [line for line in mutation.new_source.splitlines() if line not in MODULE.splitlines()]
            pairs.append((" | ".join(old), " | ".join(new)))
    return pairs


def test_each_rewrite_changes_one_spot_and_keeps_the_rest_of_the_line() -> None:
    assert ("    return total == (b)", "    return total != (b)") in changed_lines("flip_comparison")
    assert (
        "    if a is not None and b > 2:",
        "    if a is None and b > 2:",
    ) in changed_lines("flip_comparison")
    assert (
        "    if a is not None and b > 2:",
        "    if not (a is not None and b > 2):",
    ) in changed_lines("invert_condition")
    assert ("    total = 0  # start", "") in changed_lines("drop_statement")
    assert ("        total += a[1:b]", "        total += a[1:b - 1]") in changed_lines("off_by_one")
    assert (
        "    for i in range(len(a)):",
        "    for i in range(len(a) - 1):",
    ) in changed_lines("off_by_one")
    assert (
        "        total = g(a, b) - i",
        "        total = g(b, a) - i",
    ) in changed_lines("swap_arguments")
    assert (
        "        total = g(a, b) - i",
        "        total = g(a, b) + i",
    ) in changed_lines("change_operator")


def test_every_candidate_compiles_and_differs() -> None:
    mutations = list(candidate_mutations("m.py", MODULE))
    assert len({m.new_source for m in mutations}) == len(mutations) >= 10
    for mutation in mutations:
        compile(mutation.new_source, "m.py", "exec")
        assert mutation.new_source != MODULE and mutation.function == "f"


def test_a_drop_never_takes_a_line_shared_with_another_statement() -> None:
    source = "def f(x):\n    a = 1; b = 2\n    return a + b\n"
    assert not [m for m in candidate_mutations("m.py", source) if m.kind == "drop_statement" and m.line == 2]


def test_summary_lines_are_matched_to_known_ids_even_with_dashes_in_them() -> None:
    output = """..F
PASSED t.py::test_a
PASSED t.py::test_p[a - b]
FAILED t.py::test_p[c - d] - AssertionError: assert 1 == 2
FAILED t.py::other - boom
1 failed, 2 passed
"""
    known = {"t.py::test_a", "t.py::test_p[a - b]", "t.py::test_p[c - d]"}
    outcomes, messages = parse_summary(output, known)
    assert outcomes == {
        "t.py::test_a": "PASSED",
        "t.py::test_p[a - b]": "PASSED",
        "t.py::test_p[c - d]": "FAILED",
    }
    assert messages == {"t.py::test_p[c - d]": "AssertionError: assert 1 == 2"}
    unknown, _ = parse_summary(output)
    assert unknown["t.py::other"] == "FAILED"


def instance(instance_id: str, tests: list[str] | str, **extra) -> dict:
    return {
        "instance_id": instance_id,
        "repo": "demo",
        "base_commit": "a" * 40,
        "problem_statement": "fix it",
        "FAIL_TO_PASS": tests,
        "PASS_TO_PASS": [],
        **extra,
    }


def write_jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def test_instances_are_filtered_shuffled_and_cut_as_configured(tmp_path: Path) -> None:
    rows = [instance(f"i{n}", [f"t.py::test_{n}"]) for n in range(10)]
    rows.append(instance("not-python", json.dumps(["tests/test.js::works"])))
    dataset = write_jsonl(tmp_path / "set.jsonl", rows)
    everything = selected_ids(SweSmithConfig(dataset=dataset, shuffle=False, python_only=False))
    assert everything == [f"i{n}" for n in range(10)] + ["not-python"]
    python = selected_ids(SweSmithConfig(dataset=dataset, shuffle=False))
    assert python == [f"i{n}" for n in range(10)]
    shuffled = selected_ids(SweSmithConfig(dataset=dataset, seed=3))
    assert sorted(shuffled) == python and shuffled != python
    assert shuffled == selected_ids(SweSmithConfig(dataset=dataset, seed=3))
    assert selected_ids(SweSmithConfig(dataset=dataset, seed=3, max_items=4)) == shuffled[:4]
    env = get_env("swe_smith", {"dataset": dataset, "shuffle": False, "max_items": 3})
    assert [item.id for item in env.load_items(5, offset=1)] == [
        "i1",
        "i2",
        "i0",
        "i1",
        "i2",
    ]
    assert read_instances(dataset)["not-python"].FAIL_TO_PASS == ["tests/test.js::works"]


def test_prompt_modes(tmp_path: Path) -> None:
    dataset = write_jsonl(tmp_path / "set.jsonl", [instance("i0", ["t.py::a"], text="ORACLE CONTEXT")])
    plain = get_env("swe_smith", {"dataset": dataset}).format_prompt(Item(id="i0"))
    oracle = get_env("swe_smith", {"dataset": dataset, "prompt_mode": "problem_statement+text"}).format_prompt(
        Item(id="i0")
    )
    assert "fix it" in plain and "ORACLE CONTEXT" not in plain
    assert oracle.startswith(plain) and oracle.endswith("ORACLE CONTEXT")


def test_bad_input_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="prompt_mode"):
        get_env("swe_smith", {"prompt_mode": "everything"})
    with pytest.raises(ConfigError, match="datset"):
        get_env("swe_smith", {"datset": "x.jsonl"})
    with pytest.raises(ConfigError, match="Hugging Face"):
        get_env("swe_smith", {"dataset": "NousResearch/SWE-smith-oracle"})
    bad = write_jsonl(
        tmp_path / "bad.jsonl",
        [
            instance("i0", ["t.py::a"]),
            {**instance("i1", ["t.py::a"]), "base_commit": "main; rm -rf /"},
        ],
    )
    with pytest.raises(ConfigError, match="row 2"):
        read_instances(bad)
    with pytest.raises(ConfigError, match="cannot be read"):
        read_instances(tmp_path / "missing.jsonl")


def test_shaped_reward_follows_the_original() -> None:
    assert shaped_reward(0, installed=True, tests_passed=True) == 0.0
    assert shaped_reward(1, installed=False, tests_passed=False) == pytest.approx(0.05)
    assert shaped_reward(4, installed=False, tests_passed=False) == pytest.approx(0.2)
    assert shaped_reward(20, installed=False, tests_passed=False) == pytest.approx(0.3)
    assert shaped_reward(2, installed=True, tests_passed=False) == pytest.approx(0.4)
    assert shaped_reward(2, installed=True, tests_passed=True) == 1.0


def test_chunks_keep_order() -> None:
    assert chunks(["a", "b", "c", "d", "e"], 2) == [["a", "b"], ["c", "d"], ["e"]]
