"""The layers point one way: a module imports only from layers below its own, or from its own package.

    6  worker, temporal_rollouts.{cli, runtime, integrations, demo_policy}   (may import each other)
    5  workflows
    4  activities
    3  envs | temporal_rollouts.sinks
    2  temporal_rollouts.{llm | sandbox | storage | tools}
    1  temporal_rollouts.core
    0  temporal_rollouts.sandbox_server | temporal_rollouts.policy_servers
       (separate programs: each imports nothing else of the project)

Parts on one layer do not import each other. Imports under `if TYPE_CHECKING:` count too,
except where they only name a type for a module of the same package. Run this file as a
script to print the counts (upward imports, cycles, top-level names, modules per folder).
"""

from __future__ import annotations

import ast
import sys
from collections import Counter
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support import REPO  # noqa: E402

PROJECT_ROOTS = ("temporal_rollouts", "workflows", "activities", "envs", "worker")
UNITS: dict[str, int] = {
    "temporal_rollouts.sandbox_server": 0,
    "temporal_rollouts.policy_servers": 0,
    "temporal_rollouts.core": 1,
    "temporal_rollouts.llm": 2,
    "temporal_rollouts.sandbox": 2,
    "temporal_rollouts.storage": 2,
    "temporal_rollouts.tools": 2,
    "envs": 3,
    "temporal_rollouts.sinks": 3,
    "activities": 4,
    "workflows": 5,
    "worker": 6,
    "temporal_rollouts.cli": 6,
    "temporal_rollouts.runtime": 6,
    "temporal_rollouts.integrations": 6,
    "temporal_rollouts.demo_policy": 6,
    "temporal_rollouts": 6,
}
TOP = 6


def unit_of(module: str) -> str:
    return max((unit for unit in UNITS if module == unit or module.startswith(unit + ".")), key=len)


def project_modules() -> dict[str, Path]:
    found = {}
    for path in sorted(REPO.rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[0] not in PROJECT_ROOTS and rel.name != "worker.py":
            continue
        if rel.parts[0] == "worker.py" or (rel.parts[0] in PROJECT_ROOTS and len(rel.parts) >= 1):
            parts = list(rel.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imports_of(module: str, path: Path) -> list[tuple[str, bool]]:
    """(imported project module, only under TYPE_CHECKING) for every import in the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    typing_only: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            typing_only.update(id(child) for child in ast.walk(node))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        for name in names:
            if name.split(".")[0] in PROJECT_ROOTS:
                found.append((name, id(node) in typing_only))
    return found


def resolve(name: str, modules: dict[str, Path]) -> str | None:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def upward_imports() -> list[str]:
    modules = project_modules()
    problems = []
    for module, path in modules.items():
        here = unit_of(module)
        for name, typing_only in imports_of(module, path):
            target = resolve(name, modules)
            if target is None:
                continue
            there = unit_of(target)
            if there == here or (UNITS[here] == TOP and UNITS[there] == TOP):
                continue
            if UNITS[there] < UNITS[here] and not (here == "temporal_rollouts.sandbox_server"):
                continue
            if typing_only and there == here:
                continue
            problems.append(f"{module} (layer {UNITS[here]}) imports {target} (layer {UNITS[there]})")
    return sorted(set(problems))


def cycles() -> list[list[str]]:
    """Groups of modules that import each other at run time (TYPE_CHECKING imports left out)."""
    modules = project_modules()
    graph = {m: set() for m in modules}
    for module, path in modules.items():
        for name, typing_only in imports_of(module, path):
            target = resolve(name, modules)
            if target and target != module and not typing_only and not module.startswith(target + "."):
                graph[module].add(target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                item = stack.pop()
                on_stack.discard(item)
                group.append(item)
                if item == node:
                    break
            if len(group) > 1:
                groups.append(sorted(group))

    sys.setrecursionlimit(10_000)
    for node in graph:
        if node not in index:
            visit(node)
    return groups


def test_no_import_runs_upward() -> None:
    assert upward_imports() == []


def test_the_sandbox_server_imports_nothing_else_of_the_project() -> None:
    modules = project_modules()
    for module, path in modules.items():
        if unit_of(module) == "temporal_rollouts.sandbox_server":
            outside = [n for n, _ in imports_of(module, path) if not n.startswith("temporal_rollouts.sandbox_server")]
            assert outside == [], f"{module} imports {outside}"


def test_no_import_cycles() -> None:
    assert cycles() == []


def main() -> None:
    modules = project_modules()
    print("upward imports:", len(upward_imports()))
    for line in upward_imports():
        print("  ", line)
    print("cycles:", len(cycles()))
    for group in cycles():
        print("  ", " <-> ".join(group))
    tops = sorted({m.split(".")[0] for m in modules})
    print("top-level import names:", len(tops), tops)
    per_folder = Counter(str(path.parent.relative_to(REPO)) for path in modules.values())
    for folder, count in sorted(per_folder.items()):
        print(f"   {folder}: {count} modules")


if __name__ == "__main__":
    main()
